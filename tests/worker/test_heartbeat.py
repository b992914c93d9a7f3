"""The worker side of heartbeats: device probe, running jobs, the heartbeat row."""
import os
import time

import pytest
from celery.worker import state as worker_state

from webapp.workers.models import Worker
from worker.heartbeat import Heartbeat, current_jobs, probe_devices


class FakeRequest:
    def __init__(self, name, argsrepr):
        self.name = name
        self.argsrepr = argsrepr


def test_probe_devices_reports_jax_view_of_this_host():
    # The root conftest gives this process (and so the probe subprocess) 8 CPU devices.
    devices = probe_devices()
    assert devices["platform"] == "cpu"
    assert devices["count"] == 8
    assert devices["memory_bytes"] is None
    assert devices["jax_version"]


def test_probe_devices_reports_failure(monkeypatch):
    monkeypatch.setattr("worker.heartbeat.PROBE_SCRIPT", "raise SystemExit('no backend here')")
    assert "no backend here" in probe_devices()["error"]


def test_a_probe_told_the_worker_is_stopping_ends_its_subprocess():
    seen = []
    assert probe_devices(started=lambda process: seen.append(process) or False) == {
        "error": "the worker stopped before its device probe answered"}
    assert seen[0].returncode is not None  # killed and reaped, not left importing jax


@pytest.mark.django_db(transaction=True)
def test_stopping_the_heartbeat_ends_a_probe_still_running(monkeypatch):
    # up.sh's Ctrl-C test once found a probe still importing jax after its worker had stopped.
    monkeypatch.setattr("worker.heartbeat.PROBE_SCRIPT", "import time; time.sleep(60)")
    heartbeat = Heartbeat(name="default@slow-probe", queues=["default"], interval_seconds=10)
    heartbeat.start()
    deadline = time.monotonic() + 10
    while heartbeat._probe_process is None:
        assert time.monotonic() < deadline, "the probe did not start within 10 s"
        time.sleep(0.01)
    probe = heartbeat._probe_process
    heartbeat.stop()
    assert probe.wait(timeout=10) == -9  # killed by stop(), not left to sleep its minute


def test_current_jobs_lists_accepted_requests():
    request = FakeRequest("worker.tasks.train.run", "('run_abc',)")
    worker_state.active_requests.add(request)
    try:
        assert current_jobs() == ["worker.tasks.train.run ('run_abc',)"]
    finally:
        worker_state.active_requests.discard(request)


@pytest.mark.django_db(transaction=True)
def test_heartbeat_thread_reports_probed_devices_then_stops(monkeypatch):
    # Transactional: the heartbeat thread has its own connection and must see committed rows.
    monkeypatch.setattr("worker.heartbeat.probe_devices", lambda **kwargs: {"platform": "cpu", "count": 8})
    heartbeat = Heartbeat(name="default@test", queues=["default"], interval_seconds=0.05)
    heartbeat.start()
    deadline = time.monotonic() + 10
    while not Worker.objects.filter(name="default@test", devices__count=8).exists():
        assert time.monotonic() < deadline, "no heartbeat with the probed devices within 10 s"
        time.sleep(0.05)
    heartbeat.stop()
    row = Worker.objects.get(name="default@test")
    assert (row.queues, row.pid, row.current_jobs) == (["default"], os.getpid(), [])
    assert row.stopped_at is not None
    last_seen = row.last_seen
    time.sleep(0.2)
    row.refresh_from_db()
    assert row.last_seen == last_seen, "the thread kept beating after stop()"
