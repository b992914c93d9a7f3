"""Reads of worker heartbeats for the Workers page, ``/metrics`` and the host pools a launch can use."""
from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True, kw_only=True)
class PoolOffer:
    """What the live train workers of one host pool offer a job, as their heartbeats say."""

    name: str
    workers: int
    # The devices each worker has, when every probed worker of the pool reports the same count
    # (None while they probe, or when they differ: then only the job's start can check a layout).
    devices_per_worker: int | None
    platform: str
    kinds: tuple[str, ...]

    def devices_for(self, hosts: int) -> int | None:
        """The devices a job of ``hosts`` processes on this pool gets (each host one worker's)."""
        return None if self.devices_per_worker is None else hosts * self.devices_per_worker

    @property
    def summary(self) -> str:
        """``2 workers × 8 gpu devices (NVIDIA H200)``, in words."""
        workers = f"{self.workers} worker{'s' if self.workers != 1 else ''}"
        if self.devices_per_worker is None:
            return f"{workers}, devices not known yet"
        device = f"{self.devices_per_worker} {self.platform} device{'s' if self.devices_per_worker != 1 else ''}"
        return f"{workers} × {device}" + (f" ({', '.join(self.kinds)})" if self.kinds else "")


def pool_offers(*, now: datetime | None = None) -> dict[str, PoolOffer]:
    """The host pools of the train workers alive at ``now`` (heartbeat within ``STALE_AFTER``), by name."""
    now = now or timezone.now()
    by_pool: dict[str, list[Worker]] = {}
    for worker in Worker.objects.filter(stopped_at__isnull=True, last_seen__gte=now - STALE_AFTER).exclude(pool=""):
        by_pool.setdefault(worker.pool, []).append(worker)
    offers = {}
    for name, workers in sorted(by_pool.items()):
        probed = [worker.devices for worker in workers if isinstance(worker.devices.get("count"), int)]
        counts = {devices["count"] for devices in probed}
        offers[name] = PoolOffer(
            name=name, workers=len(workers),
            devices_per_worker=counts.pop() if len(counts) == 1 and len(probed) == len(workers) else None,
            platform="/".join(sorted({str(devices.get("platform", "?")) for devices in probed})),
            kinds=tuple(sorted({kind for devices in probed for kind in devices.get("kinds", [])})))
    return offers
