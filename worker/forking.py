"""The worker's main process forks pool children while its own threads use the database.

Design note. A train worker of a host pool forks a fresh pool child for every job
(``--max-tasks-per-child 1``), in its main process, at whatever moment the previous job ends; its
heartbeat and reaper threads (``worker/heartbeat.py``, ``worker/reaper.py``) query the database in
that same process every second or few, and the thread that settles a dead host process's run
(``worker.tasks.train.settle_host_crash``) does so just as the dead process is replaced. ``fork`` copies only the forking thread, but all of SQLite's
process state: a mutex another thread held at that instant stays held in the child for ever, and
the child's first query blocks on it (seen: a host's child stuck in ``sqlite3Malloc`` opening its
connection, its job never started, the other host waiting for it); an open connection's lock
bookkeeping is inherited without the file locks it stands for, so the child's connection can read
a stale database (seen: host 0 dropping its placement message as "not queued as this attempt any
more" for a run that was queued as that attempt, while host 1 joined and waited for it). SQLite says
it plainly: no connection may cross a fork.

So those threads use the database only inside ``database_round()``, which closes their connection
before it returns, and a fork of this process waits for the round in progress
(``os.register_at_fork``): a child is always forked with no database call in flight and no
connection open. A fork waits for at most one round (milliseconds; SQLite's busy timeout at worst).
On PostgreSQL "closed" means handed back to the process's pool, still open: the child drops the pool
it inherits without closing those connections (``webapp.core.db_pool``), which its parent still uses.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import close_old_connections, connection

_rounds = threading.Lock()


@contextmanager
def database_round() -> Iterator[None]:
    """Use the database from a thread of the worker's main process; no fork happens meanwhile, and
    the thread's connection is closed when the round ends."""
    with _rounds:
        close_old_connections()
        try:
            yield
        finally:
            connection.close()


def _release_after_fork() -> None:
    _rounds.release()


os.register_at_fork(before=_rounds.acquire, after_in_parent=_release_after_fork,
                    after_in_child=_release_after_fork)
