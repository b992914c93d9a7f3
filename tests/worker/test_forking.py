"""A worker's main process forks pool children only between its threads' database rounds
(worker/forking.py): a fork waits for the round in progress, and the child can use SQLite.

Why: on 2026-12-01 a host's pool child, forked while its worker's heartbeat or reaper thread was inside
SQLite, blocked for ever in ``sqlite3Malloc`` on the mutex that thread held (gdb showed it), so its
job never started and its peer waited for it; a child forked with a connection open can read a stale
database (the CI failure: host 0 dropped a queued run's message as stale)."""
from __future__ import annotations

import os
import sqlite3
import threading
import time

from worker import forking


def test_a_fork_waits_for_the_database_round_in_progress_and_the_child_can_use_sqlite(tmp_path):
    in_round, end_round, forked = threading.Event(), threading.Event(), threading.Event()
    children: list[int] = []

    def a_round():  # the heartbeat, mid-query
        with forking.database_round():
            in_round.set()
            end_round.wait(10)

    def fork_a_child():  # billiard replacing a pool child
        pid = os.fork()
        if pid == 0:
            try:
                database = sqlite3.connect(tmp_path / "child.sqlite3", timeout=5)
                database.execute("create table t (x)")
                database.close()
            finally:
                os._exit(0 if (tmp_path / "child.sqlite3").exists() else 1)
        children.append(pid)
        forked.set()

    holder = threading.Thread(target=a_round)
    holder.start()
    assert in_round.wait(10)
    forker = threading.Thread(target=fork_a_child)
    forker.start()
    assert not forked.wait(0.5)  # the fork waits while the round is on
    started = time.monotonic()
    end_round.set()
    assert forked.wait(10)
    forker.join(10)
    holder.join(10)
    assert time.monotonic() - started < 5
    _, status = os.waitpid(children[0], 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_heartbeats_and_reaper_rounds_are_database_rounds(monkeypatch):
    from worker import heartbeat, reaper

    held = []

    def record(**kwargs):
        held.append(forking._rounds.locked())

    monkeypatch.setattr(heartbeat, "worker_heartbeat_record", record)
    for name in ("runs_reap_lost", "runs_requeue_lost_messages", "runs_replace_unstarted", "runs_place_waiting",
                 "pipelines_fail_lost_exports", "checkpoint_exports_fail_lost"):
        monkeypatch.setattr(reaper, name, lambda **kwargs: held.append(forking._rounds.locked()) or [])

    def rounds():
        heartbeat.Heartbeat(name="train@h", queues=["train"], interval_seconds=1).beat()
        reaper.Reaper(interval_seconds=1).reap_once()

    # In a thread of its own, as in a worker: the test thread may hold a connection an earlier
    # database test left open, which the round's close_old_connections would check, and pytest-django
    # refuses database access in a test without the django_db mark.
    thread = threading.Thread(target=rounds)
    thread.start()
    thread.join(30)
    assert held == [True] * 7
    assert not forking._rounds.locked()
