"""Reads of worker heartbeats for the Workers page and ``/metrics``."""
from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from webapp.workers.models import FORGET_AFTER, STALE_AFTER, Worker


def worker_list(*, now: datetime | None = None) -> list[Worker]:
    """The workers heard from within ``FORGET_AFTER``, by name, each with ``state``
    set (alive / stale / stopped) as of ``now``."""
    now = now or timezone.now()
    workers = list(Worker.objects.filter(last_seen__gte=now - FORGET_AFTER).select_related("reserved_run").order_by("name"))
    for worker in workers:
        worker.state = worker.state_at(now)
    return workers


def workers_alive_count(*, now: datetime | None = None) -> int:
    """How many workers have sent a heartbeat within ``STALE_AFTER`` and not stopped."""
    now = now or timezone.now()
    return Worker.objects.filter(stopped_at__isnull=True, last_seen__gte=now - STALE_AFTER).count()
