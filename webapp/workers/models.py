"""Worker heartbeats: one row per Celery worker (keyed by its node name, e.g.
``train@gpu-host-1``), rewritten every few seconds by ``worker/heartbeat.py``.
A worker whose row has not been refreshed within ``stale_after()`` is presumed lost."""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models


def stale_after() -> timedelta:
    """How long a worker may be silent before it is presumed lost (``TEMPER_WORKER_STALE_AFTER``, 60 s)."""
    return timedelta(seconds=settings.TEMPER_WORKER_STALE_AFTER)


# Workers silent for longer than this are gone (a container replaced, a host retired):
# they leave the Workers page and /metrics, though their rows stay for the record.
FORGET_AFTER = timedelta(days=1)


class WorkerState(models.TextChoices):
    ALIVE = "alive", "Alive"
    STALE = "stale", "Stale"
    STOPPED = "stopped", "Stopped"


class Worker(models.Model):
    name = models.CharField(max_length=255, unique=True)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    # {"platform": "gpu", "count": 8, "kinds": ["NVIDIA H200"], "memory_bytes": 150000000000}
    # or {} while the worker is still probing, {"error": "..."} when probing failed.
    devices = models.JSONField(default=dict)
    current_jobs = models.JSONField(default=list)
    # The broker delivery tags of the messages it holds (running or reserved): a message Redis keeps as
    # delivered that no live worker holds lost its worker (``webapp.workers.deliveries``).
    deliveries = models.JSONField(default=list)
    # The host pool of a train worker (queue ``train``: "default", ``train-<pool>``: <pool>), where
    # its peers reach it (``address``) and a port free for a job's coordinator on it.
    pool = models.CharField(max_length=40, blank=True)
    address = models.CharField(max_length=255, blank=True)
    coordinator_port = models.PositiveIntegerField(null=True)
    # Held for one attempt of a multi-host run from placement until its task ends
    # (``webapp.runs.placement``); void once that attempt is no longer the run's active one.
    reserved_run = models.ForeignKey("runs.Run", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    reserved_attempt = models.PositiveIntegerField(null=True)
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def shared_queues(self) -> list[str]:
        """The queues it takes work from, without its own ``<name>.dq2`` (Celery's ``worker_direct`` queue,
        which every worker has and only placement uses): what the Workers page lists."""
        return [queue for queue in self.queues if queue != f"{self.name}.dq2"]

    @property
    def holds_reservation(self) -> bool:
        """Whether the worker is reserved for an attempt of a multi-host run that is still active."""
        run = self.reserved_run
        return run is not None and run.is_active and run.attempt == self.reserved_attempt

    def state_at(self, now) -> str:
        """The worker's state at ``now``: stopped (shut down cleanly), stale (no
        heartbeat for longer than ``stale_after()``) or alive."""
        if self.stopped_at is not None:
            return WorkerState.STOPPED
        if now - self.last_seen > stale_after():
            return WorkerState.STALE
        return WorkerState.ALIVE
