"""Liveness of a multi-host run's processes over a real Redis: heartbeats that expire name the lost
host, a peer that finished its part is not lost, a peer never seen is left to jax's timeout, and the
watchdog's verdict fails the run naming the host."""
from __future__ import annotations

import time

import pytest

from tests.webapp.factories import make_team
from webapp.runs import channels, placement
from webapp.runs.models import Run, RunStatus
from worker import multihost
from worker.multihost import HostLiveness

pytestmark = pytest.mark.integration


@pytest.fixture
def run(db, settings, redis_url):
    settings.REDIS_URL = redis_url
    team = make_team()
    return Run.objects.create(
        project=team.project, name="mh", task="sft", spec={}, resolved_spec={"output_dir": "/tmp/x"}, hosts=3,
        status=RunStatus.RUNNING, current_step=12,
        placement={"attempt": 1, "pool": "tpu", "coordinator": "h:1", "hosts": [
            {"process": index, "worker": f"train-tpu@h{index}", "address": "h"} for index in range(3)]})


def peer_beats(run: Run, process: int, *, seconds: int) -> None:
    client = channels.redis_client()
    client.set(channels.host_key(run.public_id, run.attempt, process), f"train-tpu@h{process}", ex=seconds)
    client.close()


def running_two_host_run() -> Run:
    """A 2-host run at step 12, placed on train-tpu@h0 and train-tpu@h1."""
    team = make_team()
    return Run.objects.create(
        project=team.project, name="mh", task="sft", spec={}, resolved_spec={"output_dir": "/tmp/x"}, hosts=2,
        status=RunStatus.RUNNING, current_step=12,
        placement={"attempt": 1, "pool": "tpu", "coordinator": "h:1", "hosts": [
            {"process": index, "worker": f"train-tpu@h{index}", "address": "h"} for index in range(2)]})


def test_a_peer_seen_then_silent_is_lost_and_a_finished_one_is_not(run):
    liveness = HostLiveness(run=run, process_id=0, num_processes=3, worker_name="train-tpu@h0", lost_seconds=1)
    try:
        assert liveness.check() is None  # nobody seen yet: still starting, not lost
        peer_beats(run, 1, seconds=1)
        peer_beats(run, 2, seconds=1)
        assert liveness.check() is None
        client = channels.redis_client()
        client.set(channels.host_key(run.public_id, 1, 2), multihost.DONE, ex=60)  # host 2 finished its part
        client.close()
        time.sleep(1.3)  # host 1's heartbeat expires
        assert liveness.check() == "host 1 lost"
    finally:
        liveness._client.close()


def test_a_process_beats_while_alive_and_says_done_or_leaves_when_it_stops(run):
    liveness = HostLiveness(run=run, process_id=1, num_processes=3, worker_name="train-tpu@h1", lost_seconds=5)
    client = channels.redis_client()
    key = channels.host_key(run.public_id, 1, 1)
    liveness.start()
    assert client.get(key) == b"train-tpu@h1" and 0 < client.ttl(key) <= 5
    liveness.stop(finished=True)
    assert client.get(key) == multihost.DONE
    other = HostLiveness(run=run, process_id=2, num_processes=3, worker_name="train-tpu@h2", lost_seconds=5)
    other.start()
    other.stop(finished=False)
    assert client.get(channels.host_key(run.public_id, 1, 2)) is None  # its peers stop at once
    client.close()


def test_the_watchdog_verdict_fails_the_run_naming_the_host_and_ends_the_process(transactional_db, settings,
                                                                                   redis_url, monkeypatch):
    settings.REDIS_URL = redis_url
    run = running_two_host_run()
    ended = []
    monkeypatch.setattr(multihost, "end_process", ended.append)
    liveness = HostLiveness(run=run, process_id=0, num_processes=2, worker_name="train-tpu@h0", lost_seconds=2)
    peer_beats(run, 1, seconds=2)
    liveness.start()  # the watchdog sees host 1, then its heartbeat expire
    deadline = time.monotonic() + 10
    while not ended and time.monotonic() < deadline:
        time.sleep(0.1)
    run.refresh_from_db()
    assert ended == ["host 1 lost"]
    assert run.status == RunStatus.FAILED
    assert run.error_message.startswith("host 1 (worker train-tpu@h1) lost at step 12; the other hosts were stopped")
    # It stopped beating and says so: a fallback verdict would not take it for lost.
    client = channels.redis_client()
    time.sleep(1.5)
    assert client.get(channels.host_key(run.public_id, 1, 0)) == multihost.STOPPED
    assert placement.silent_hosts(run) == [1]
    client.close()
    liveness.stop(finished=False)


def test_a_verdict_the_database_refused_is_written_on_a_later_try(transactional_db, settings, redis_url,
                                                                   monkeypatch):
    """The first write of the verdict fails as a database busy past its timeout does: the watchdog
    writes it again instead of ending the process with the run still running (which left the reaper
    to name every silent host, host 0 included, in a 2026-12-01 CI run)."""
    from django.db import OperationalError

    from webapp.runs import reporting

    settings.REDIS_URL = redis_url
    run = running_two_host_run()
    ended, tries = [], []
    real_fail = reporting.run_fail_hosts_lost

    def busy_once(**kwargs):
        tries.append(kwargs["lost"])
        if len(tries) == 1:
            raise OperationalError("database is locked")
        return real_fail(**kwargs)

    monkeypatch.setattr(multihost, "end_process", ended.append)
    monkeypatch.setattr(reporting, "run_fail_hosts_lost", busy_once)
    liveness = HostLiveness(run=run, process_id=0, num_processes=2, worker_name="train-tpu@h0", lost_seconds=2)
    peer_beats(run, 1, seconds=2)
    liveness.start()
    deadline = time.monotonic() + 15
    while not ended and time.monotonic() < deadline:
        time.sleep(0.1)
    liveness.stop(finished=False)
    run.refresh_from_db()
    assert ended == ["host 1 lost"] and tries == [[1], [1]]
    assert run.status == RunStatus.FAILED and run.error_message.startswith("host 1 (worker train-tpu@h1) lost")


def test_the_watchdog_ends_a_process_whose_attempt_was_placed_again_without_failing_the_run(
        transactional_db, settings, redis_url, monkeypatch):
    """Host 1 started and waits for host 0, whose task never started: once the reaper places the run
    again as attempt 2 (``placement.runs_replace_unstarted``), host 1's watchdog ends its process within
    a second or two, naming why, and records no lost host (attempt 2 is not touched)."""
    settings.REDIS_URL = redis_url
    team = make_team()
    run = Run.objects.create(
        project=team.project, name="mh", task="sft", spec={}, resolved_spec={"output_dir": "/tmp/x"}, hosts=2,
        placement={"attempt": 1, "pool": "tpu", "coordinator": "h:1", "started": [1], "hosts": [
            {"process": index, "worker": f"train-tpu@h{index}", "address": "h"} for index in range(2)]})
    ended = []
    monkeypatch.setattr(multihost, "end_process", ended.append)
    liveness = HostLiveness(run=run, process_id=1, num_processes=2, worker_name="train-tpu@h1", lost_seconds=2)
    liveness.start()
    time.sleep(1.5)
    assert ended == []  # host 0 never seen: not lost, and the attempt is still on
    Run.objects.filter(pk=run.pk).update(attempt=2, placement={})
    deadline = time.monotonic() + 10
    while not ended and time.monotonic() < deadline:
        time.sleep(0.1)
    liveness.stop(finished=False)
    assert ended == ["attempt 1 was superseded by attempt 2"]
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.attempt == 2 and run.error_message == ""


def test_after_a_silent_crash_the_main_process_names_the_peer_that_went(transactional_db, settings, redis_url):
    """Host 0's pool process aborted without a word (gloo's SIGABRT when its peer vanished mid-collective,
    in a 2026-12-01 clean-clone run: the reaper then named both hosts). Its worker's main process waits
    for the peers' keys: host 1's expires, so host 1 is recorded as lost, host 0 is left 'stopped', and
    its reservation is given back."""
    from webapp.workers.models import Worker
    from worker.tasks.train import settle_host_crash

    settings.REDIS_URL = redis_url
    settings.TEMPER_HOST_LOST_SECONDS = 2
    run = running_two_host_run()
    from django.utils import timezone

    Worker.objects.create(name="train-tpu@h0", host="h0", pid=1, queues=["train"], pool="tpu", reserved_run=run,
                          reserved_attempt=1, started_at=timezone.now(), last_seen=timezone.now())
    peer_beats(run, 0, seconds=2)  # the dead process's last beat, still in Redis
    peer_beats(run, 1, seconds=1)  # host 1, killed: its key runs out
    assert settle_host_crash(run_pk=run.pk, attempt=1, process_id=0, num_processes=2, worker_name="train-tpu@h0") == [1]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.error_message.startswith("host 1 (worker train-tpu@h1) lost at step 12; the other hosts were stopped")
    client = channels.redis_client()
    assert client.get(channels.host_key(run.public_id, 1, 0)) == multihost.STOPPED
    client.close()
    time.sleep(2.2)
    assert placement.silent_hosts(run) == [1]  # a later fallback verdict would name host 1 alone too
    assert Worker.objects.get(name="train-tpu@h0").reserved_run is None


def test_settling_a_crash_uses_the_database_only_in_rounds(transactional_db, settings, redis_url):
    """The main process forks the dead process's replacement while it settles the crash, and a child
    forked with a query in flight or a connection open can read a stale database (worker/forking.py).
    QA on 2026-12-04: host 1 killed, host 0's worker settled the loss outside a round; its next pool
    child dropped the resumed run's placement as "attempt is not placed" (it had been placed), and the
    resume waited TEMPER_HOST_START_SECONDS for a new placement."""
    from django.db import connection

    from webapp.workers.models import Worker
    from worker import forking
    from worker.tasks.train import settle_host_crash

    settings.REDIS_URL = redis_url
    settings.TEMPER_HOST_LOST_SECONDS = 1
    run = running_two_host_run()
    from django.utils import timezone

    Worker.objects.create(name="train-tpu@h0", host="h0", pid=1, queues=["train"], pool="tpu", reserved_run=run,
                          reserved_attempt=1, started_at=timezone.now(), last_seen=timezone.now())
    peer_beats(run, 1, seconds=1)
    outside_rounds = []

    def only_in_rounds(execute, sql, params, many, context):
        if not forking._rounds.locked():
            outside_rounds.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(only_in_rounds):
        assert settle_host_crash(run_pk=run.pk, attempt=1, process_id=0, num_processes=2,
                                 worker_name="train-tpu@h0") == [1]
    assert outside_rounds == []
    assert connection.connection is None  # no connection left open for a later fork
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.error_message.startswith("host 1 (worker train-tpu@h1) lost")
    assert Worker.objects.get(name="train-tpu@h0").reserved_run is None


def test_after_a_crash_with_every_peer_alive_nothing_is_recorded(transactional_db, settings, redis_url):
    """A host whose own process died (its peers still beat) is the lost one: its main process records
    nothing and leaves its key to expire, for the peers' watchdogs (or the reaper) to name it."""
    from worker.tasks.train import settle_host_crash

    settings.REDIS_URL = redis_url
    settings.TEMPER_HOST_LOST_SECONDS = 1
    run = running_two_host_run()
    peer_beats(run, 1, seconds=30)
    started = time.monotonic()
    assert settle_host_crash(run_pk=run.pk, attempt=1, process_id=0, num_processes=2, worker_name="train-tpu@h0") == []
    assert time.monotonic() - started >= 1  # it waited for the peers' expiry time
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    client = channels.redis_client()
    assert client.get(channels.host_key(run.public_id, 1, 0)) is None
    client.close()
    assert settle_host_crash(run_pk=run.pk, attempt=2, process_id=0, num_processes=2, worker_name="w") == []


def test_the_main_process_settles_only_a_lost_train_host_process(monkeypatch):
    """Celery sends task_failure from the worker's main process when a pool process died
    (WorkerLostError): for train_host the crash is settled, with the task's own arguments."""
    import threading
    import types

    from billiard.exceptions import WorkerLostError
    from celery import signals

    from worker.tasks import train

    settled, done = [], threading.Event()
    monkeypatch.setattr(train, "settle_host_crash", lambda **kwargs: (settled.append(kwargs), done.set()))
    monkeypatch.setattr(train, "settle_run_crash", lambda **kwargs: None)  # tests/worker/test_lost_runs.py
    class Task:  # what Celery passes as the sender: the task, its request on the stack
        def __init__(self, name):
            self.name, self.request = name, types.SimpleNamespace(hostname="train-tpu@h0")

    sender = Task(train.train_host.name)
    arguments = [7, 2, 0, 2, "h:1"]
    signals.task_failure.send(sender=sender, exception=ValueError("an engine error"), args=arguments)
    signals.task_failure.send(sender=Task(train.train_run.name), exception=WorkerLostError("signal 6"), args=arguments)
    signals.task_failure.send(sender=sender, exception=WorkerLostError("signal 6 (SIGABRT)"), args=arguments)
    assert done.wait(5)
    assert settled == [dict(run_pk=7, attempt=2, process_id=0, num_processes=2, worker_name="train-tpu@h0")]
