"""Writes of worker heartbeats; called from the worker process (``worker/heartbeat.py``)."""
from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from webapp.workers.models import Worker


def worker_heartbeat_record(
    *,
    name: str,
    host: str,
    pid: int,
    queues: list[str],
    devices: dict,
    current_jobs: list[str],
    started_at: datetime,
    deliveries: list[str] = (),
    pool: str = "",
    address: str = "",
    coordinator_port: int | None = None,
) -> Worker:
    """Create or refresh the row of worker ``name``; a restarted worker (same name)
    takes the row over and is alive again. Train workers also give their host pool, the
    address their peers reach them at and a port free for a job's coordinator."""
    worker, _ = Worker.objects.update_or_create(
        name=name,
        defaults={
            "host": host,
            "pid": pid,
            "queues": queues,
            "devices": devices,
            "current_jobs": current_jobs,
            "deliveries": list(deliveries),
            "pool": pool,
            "address": address,
            "coordinator_port": coordinator_port,
            "started_at": started_at,
            "last_seen": timezone.now(),
            "stopped_at": None,
        },
    )
    return worker


def worker_mark_stopped(*, name: str, pid: int) -> None:
    """Record a clean shutdown, unless another process has since taken the name over."""
    Worker.objects.filter(name=name, pid=pid).update(stopped_at=timezone.now(), current_jobs=[], deliveries=[])
