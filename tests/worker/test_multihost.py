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
