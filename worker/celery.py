"""``celery -A worker.celery worker -Q default`` finds the app here.

Django is set up before the task modules are imported, since they use the ORM.
"""
import os

import django

from webapp.celery import app

django.setup()

from django.conf import settings  # noqa: E402

from webapp.core import db_pool  # noqa: E402

db_pool.register()  # prefork children do not close the pooled connections they inherit (see the module)

# Compiled XLA programs persist across worker restarts (jax reads this before its first import, which
# the task modules below make): a fresh serve worker would otherwise recompile every cache shape of its
# first chats, several seconds each on CPU. Every program is kept, not only those that took jax's default
# second to compile: the demo model's decode calls take 0.3-1.5 s, and a restarted worker's first
# answer took 4.6 s with the default and 1.2 s with every program kept (bench/RESULTS.md, serving warm-up).
# An empty TEMPER_JAX_CACHE turns it off.
if settings.TEMPER_JAX_CACHE:
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(settings.TEMPER_JAX_CACHE))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import worker.tasks  # noqa: E402,F401  (registers every task)
import worker.heartbeat  # noqa: E402,F401  (connects the heartbeat signals)
import worker.reaper  # noqa: E402,F401  (finds runs whose worker was lost)

__all__ = ["app"]
