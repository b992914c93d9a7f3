"""The worker side of heartbeats: device probe, running jobs, the heartbeat row."""
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


def test_current_jobs_lists_accepted_requests():
    request = FakeRequest("worker.tasks.train.run", "('run_abc',)")
    worker_state.active_requests.add(request)
    try:
        assert current_jobs() == ["worker.tasks.train.run ('run_abc',)"]
    finally:
        worker_state.active_requests.discard(request)


@pytest.mark.django_db
def test_heartbeat_writes_and_stops():
    heartbeat = Heartbeat(name="default@test", queues=["default"], interval_seconds=10)
    heartbeat.devices = {"platform": "cpu", "count": 1}
    heartbeat.beat()
    row = Worker.objects.get(name="default@test")
    assert (row.queues, row.devices["count"], row.stopped_at) == (["default"], 1, None)
    heartbeat.stop()
    row.refresh_from_db()
    assert row.stopped_at is not None
