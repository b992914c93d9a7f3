"""``celery -A worker.celery worker -Q default`` finds the app here.

Django is set up before the task modules are imported, since they use the ORM.
"""
import django

from webapp.celery import app

django.setup()

import worker.tasks  # noqa: E402,F401  (registers every task)
import worker.heartbeat  # noqa: E402,F401  (connects the heartbeat signals)
import worker.reaper  # noqa: E402,F401  (finds runs whose worker was lost)

__all__ = ["app"]
