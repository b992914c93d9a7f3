"""A forked process must not close the PostgreSQL pool it inherited.

Each process keeps a psycopg pool (settings.py). A Celery prefork child is forked from the worker's main
process, whose heartbeat and lost-run threads have pooled connections by then (a child is forked again
each time one exits). The child inherits the pool object and copies of its connections' sockets; closing
them there — Celery's Django fixup closes the pool in every new child — sends PostgreSQL the end of
sessions the parent still uses ("server closed the connection unexpectedly" in the parent's next query).
``forget_inherited_pools``, run in the child right after the fork, drops the child's reference to the
parent's pools without closing anything (psycopg ends a connection on garbage collection only in the
process that opened it), so the child starts a pool of its own when it first needs one.
"""
from __future__ import annotations

import os

from django.conf import settings


def forget_inherited_pools() -> None:
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        return
    from django.db.backends.postgresql.base import DatabaseWrapper

    # Django keeps a process's pools in this class attribute (private; Django 5.1+), filled on first use.
    DatabaseWrapper._connection_pools = {}


def register() -> None:
    """Run ``forget_inherited_pools`` in every child forked from this process from now on."""
    os.register_at_fork(after_in_child=forget_inherited_pools)
