"""Host pools and the placement of multi-host runs on their workers.

Design note. A host pool is a Celery queue of train workers: ``train`` is the pool "default",
``train-<pool>`` any other (a TPU slice's hosts, a rack of GPU hosts). A run with ``hosts: 1`` is
sent to its pool's queue, where whichever worker is free takes it. A run with ``hosts: N`` cannot
be: N processes must start together, one per host, and N workers taking one message each would be
N separate jobs. So the web side places it: ``run_place`` reserves N free workers of the pool in
one transaction (each reservation a conditional update on the worker's row as it was read, so two
runs placed at once never share a worker, and a run that cannot get all N keeps none), then sends
each reserved worker its own task on its own queue (Celery's ``worker_direct``) with the run, the
attempt, the process index, N and the coordinator address (host 0's announced address and port).

Start handshake. Each host's task acknowledges its process on the run's placement when it starts
(``reporting.host_start``: ``placement["started"]``; process 0 also claims the run as running). An
attempt placed ``TEMPER_HOST_START_SECONDS`` ago whose hosts did not all acknowledge is half-started:
a host's message was lost, or its worker could not take it (see the known gap below). The reapers
then place the run again as a new attempt (``runs_replace_unstarted``), naming the hosts that did
not start in its log; the processes that did start see their attempt superseded
(``attempt_ended_reason``, which their watchdogs ask every second) and end, instead of waiting in
``jax.distributed``'s initialization for a peer that will never come. So an attempt either has all
its hosts or gives way to one that does, within the same overall ``TEMPER_PLACEMENT_TIMEOUT_SECONDS``
(counted from when the run was queued) after which it fails with the reason.

A run that finds fewer than N free workers stays ``queued`` with the reason shown on its page;
every worker's reaper thread calls ``runs_place_waiting`` again every few seconds, and a run that
waited ``TEMPER_PLACEMENT_TIMEOUT_SECONDS`` fails with that reason. A worker is free when it is
alive (heartbeat within ``stale_after()``), runs nothing, and holds no reservation of an attempt that
is still active; reservations therefore lapse by themselves when an attempt ends, however it ends.

"Runs nothing" is read twice: the worker's last heartbeat says no task is under way, and no run
is recorded as running on it (``Run.worker_name``, written by ``reporting.run_start`` as a task
starts), since a heartbeat is up to ``TEMPER_HEARTBEAT_SECONDS`` old. Known gap: a single-host run of
the same pool whose message the worker took in the milliseconds before it recorded its start still
delays that host's task until it finishes; the attempt is then re-placed after
``TEMPER_HOST_START_SECONDS`` (its late message is dropped as stale). Pools that serve multi-host jobs
are best kept for them.
"""
from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from webapp.celery import app as celery_app
from webapp.runs import services
from webapp.runs.models import ACTIVE_STATUSES, LogLevel, Run, RunStatus, status_phrase
from webapp.workers.models import Worker, stale_after

logger = logging.getLogger(__name__)

DEFAULT_POOL = "default"
TRAIN_QUEUE = "train"
HOST_TASK = "worker.tasks.train.train_host"


def pool_queue(pool: str) -> str:
    """The Celery queue of host pool ``pool``."""
    return TRAIN_QUEUE if pool == DEFAULT_POOL else f"{TRAIN_QUEUE}-{pool}"


def pool_of_queues(queues: list[str]) -> str:
    """The host pool a worker consuming ``queues`` belongs to ("" for a worker of no train queue)."""
    for queue in sorted(queues):
        if queue == TRAIN_QUEUE:
            return DEFAULT_POOL
        if queue.startswith(f"{TRAIN_QUEUE}-"):
            return queue[len(TRAIN_QUEUE) + 1:]
    return ""


def run_pool(run: Run) -> str:
    return run.resolved_spec.get("pool") or DEFAULT_POOL


def waiting_reason(*, needed: int, free: int, pool: str) -> str:
    return f"waiting for {needed} workers of pool {pool}: {free} free"


def is_free(worker: Worker, *, now: datetime, for_run: Run) -> bool:
    """Whether ``worker`` can take a process of ``for_run`` now (see the module notes). A reservation
    of ``for_run``'s own current attempt counts as free: placing it again re-takes the same worker."""
    if worker.stopped_at is not None or now - worker.last_seen > stale_after() or worker.current_jobs:
        return False
    if not worker.address or not worker.coordinator_port:
        return False
    return worker.reserved_run_id == for_run.pk or not worker.holds_reservation


def free_workers(*, pool: str, for_run: Run, now: datetime) -> list[Worker]:
    """The free workers of ``pool``, by name: free by their heartbeat (``is_free``) and with no
    single-host run recorded as running on them since it was sent (see the module notes)."""
    workers = Worker.objects.filter(pool=pool, stopped_at__isnull=True, last_seen__gte=now - stale_after())
    running_here = set(Run.objects.filter(status=RunStatus.RUNNING, hosts__lte=1,
                                          worker_name__in=workers.values("name")).values_list("worker_name", flat=True))
    return [worker for worker in workers.select_related("reserved_run").order_by("name")
            if worker.name not in running_here and is_free(worker, now=now, for_run=for_run)]


class _Contended(Exception):
    """A chosen worker changed between reading and reserving it: roll every reservation back."""


def _reserve(workers: list[Worker], *, run: Run, now: datetime) -> bool:
    """Reserve every one of ``workers`` for ``run``'s attempt, or none of them."""
    try:
        with transaction.atomic():
            for worker in workers:
                taken = Worker.objects.filter(
                    pk=worker.pk, reserved_run_id=worker.reserved_run_id, reserved_attempt=worker.reserved_attempt,
                    stopped_at__isnull=True,
                ).update(reserved_run=run, reserved_attempt=run.attempt)
                if not taken:
                    raise _Contended(worker.name)
    except _Contended as contended:
        logger.info("run %s: worker %s was taken meanwhile; placement retried later", run.public_id, contended)
        return False
    return True


def _fail_waiting(run: Run, reason: str, now: datetime) -> None:
    _fail_placement(run, f"{reason} after {settings.TEMPER_PLACEMENT_TIMEOUT_SECONDS} s; start more workers of the "
                         "pool (or lower hosts), then resume the run", now)


def _fail_placement(run: Run, message: str, now: datetime) -> None:
    run.status = RunStatus.FAILED
    run.error_message = message
    run.notice = run.waiting_reason = ""
    run.finished_at = now
    run.save(update_fields=["status", "error_message", "notice", "waiting_reason", "finished_at"])
    services.log_line(run, run.error_message, level=LogLevel.ERROR)
    services.publish_status(run)
    transaction.on_commit(lambda: services._advance_pipeline(run))


@transaction.atomic
def run_place(*, run: Run, now: datetime | None = None) -> bool:
    """Place the current attempt of queued multi-host ``run`` on free workers of its pool, all or none
    (see the module notes); returns whether it was placed now. A run already placed, or no longer
    queued, is left alone; one that waited too long is failed with the reason it waited."""
    now = now or timezone.now()
    run = Run.objects.select_for_update(of=("self",)).get(pk=run.pk)
    if run.status != RunStatus.QUEUED or run.hosts <= 1 or run.placement.get("attempt") == run.attempt:
        return False
    pool = run_pool(run)
    candidates = free_workers(pool=pool, for_run=run, now=now)
    if len(candidates) < run.hosts:
        reason = waiting_reason(needed=run.hosts, free=len(candidates), pool=pool)
        if (now - run.queued_at).total_seconds() > settings.TEMPER_PLACEMENT_TIMEOUT_SECONDS:
            _fail_waiting(run, reason, now)
        elif reason != run.waiting_reason:
            run.waiting_reason = reason
            run.save(update_fields=["waiting_reason"])
            services.log_line(run, reason)
        return False
    chosen = candidates[:run.hosts]
    if not _reserve(chosen, run=run, now=now):
        return False
    coordinator = f"{chosen[0].address}:{chosen[0].coordinator_port}"
    run.placement = {
        "attempt": run.attempt, "pool": pool, "coordinator": coordinator, "placed_at": now.isoformat(),
        "hosts": [{"process": index, "worker": worker.name, "address": worker.address}
                  for index, worker in enumerate(chosen)],
        "started": [],  # processes whose task started (``reporting.host_start``)
    }
    run.waiting_reason = ""
    run.save(update_fields=["placement", "waiting_reason"])
    services.log_line(run, f"placed on {run.hosts} workers of pool {pool}: "
                           + ", ".join(worker.name for worker in chosen) + f"; coordinator {coordinator}")
    messages = [(worker.name, [run.pk, run.attempt, index, run.hosts, coordinator])
                for index, worker in enumerate(chosen)]
    transaction.on_commit(lambda: _send_host_tasks(messages))
    return True


def _send_host_tasks(messages: list[tuple[str, list]]) -> None:
    from celery.utils import worker_direct

    for worker_name, arguments in messages:
        celery_app.send_task(HOST_TASK, args=arguments, queue=worker_direct(worker_name))


def runs_place_waiting(*, now: datetime | None = None) -> list[Run]:
    """Try to place every queued multi-host run (oldest first); returns those placed."""
    placed = []
    for run in Run.objects.filter(status=RunStatus.QUEUED, hosts__gt=1).order_by("queued_at"):
        if run_place(run=run, now=now):
            placed.append(run)
    return placed


def host_release(*, worker_name: str, run_pk: int, attempt: int) -> None:
    """Give back ``worker_name``'s reservation for attempt ``attempt`` of run ``run_pk`` (its host task
    ended); a reservation the worker has since been given for a later attempt stays."""
    Worker.objects.filter(name=worker_name, reserved_run_id=run_pk, reserved_attempt=attempt).update(
        reserved_run=None, reserved_attempt=None)


def attempt_ended_reason(*, run_pk: int, attempt: int) -> str | None:
    """Why the processes of attempt ``attempt`` of multi-host run ``run_pk`` must stop although none
    of their peers was lost: the attempt failed or was cancelled (while queued, before every host
    started), or it was placed again as a later attempt. None while it is the run's current attempt
    and has not failed (a succeeded attempt's processes are finishing their part)."""
    row = Run.objects.filter(pk=run_pk).values("attempt", "status").first()
    if row is None:
        return f"run {run_pk} no longer exists"
    if row["attempt"] != attempt:
        return f"attempt {attempt} was superseded by attempt {row['attempt']}"
    if row["status"] in (RunStatus.FAILED, RunStatus.CANCELLED):
        return f"attempt {attempt} {status_phrase(row['status'])}"
    return None


def unstarted_hosts(run: Run) -> list[int]:
    """The processes of ``run``'s placed attempt whose task has not started."""
    started = set(run.placement.get("started", []))
    return [host["process"] for host in run.placement.get("hosts", []) if host["process"] not in started]


def _start_overdue(run: Run, now: datetime) -> bool:
    """Whether ``run``'s current attempt was placed over ``TEMPER_HOST_START_SECONDS`` ago and some of
    its hosts have not started."""
    placed_at = run.placement.get("placed_at")
    if run.placement.get("attempt") != run.attempt or not placed_at or not unstarted_hosts(run):
        return False
    return (now - datetime.fromisoformat(placed_at)).total_seconds() > settings.TEMPER_HOST_START_SECONDS


def runs_replace_unstarted(*, now: datetime | None = None) -> list[Run]:
    """Place again, as a new attempt, every active multi-host run whose placed attempt did not start on
    all its hosts in time (see the module notes); one queued longer than the placement timeout fails
    with the reason instead. Returns the runs re-placed or failed."""
    now = now or timezone.now()
    overdue = [run for run in Run.objects.filter(status__in=ACTIVE_STATUSES, hosts__gt=1).order_by("queued_at")
               if _start_overdue(run, now)]
    return [run for run in overdue if _replace_unstarted(run, now)]


@transaction.atomic
def _replace_unstarted(run: Run, now: datetime) -> bool:
    run = Run.objects.select_for_update(of=("self",)).get(pk=run.pk)
    if run.status not in ACTIVE_STATUSES or not _start_overdue(run, now):
        return False  # started, cancelled or re-placed meanwhile
    reason = (f"{named_hosts(run, unstarted_hosts(run))} did not start within "
              f"{settings.TEMPER_HOST_START_SECONDS} s of the placement of attempt {run.attempt}")
    if (now - run.queued_at).total_seconds() > settings.TEMPER_PLACEMENT_TIMEOUT_SECONDS:
        _fail_placement(run, f"{reason}, and the run was queued over {settings.TEMPER_PLACEMENT_TIMEOUT_SECONDS} s "
                             "ago; check the pool's workers, then resume the run", now)
        return True
    message = f"{reason}; its other hosts stop and the run is placed again as attempt {run.attempt + 1}"
    run.status = RunStatus.QUEUED
    run.attempt += 1
    run.placement = {}
    run.worker_name = ""
    run.waiting_reason = message
    run.save(update_fields=["status", "attempt", "placement", "worker_name", "waiting_reason"])
    services.log_line(run, message, level=LogLevel.WARNING)
    services.publish_status(run)
    logger.warning("run %s: %s", run.public_id, message)
    run_place(run=run, now=now)
    return True


def named_hosts(run: Run, processes: list[int]) -> str:
    """``processes`` of ``run``'s placement with their workers: "host 1 (worker train-tpu@b)"."""
    named = [f"host {host['process']} (worker {host['worker']})" for host in run.placement.get("hosts", [])
             if host["process"] in processes]
    return " and ".join(named or [f"host {', '.join(map(str, processes))}"])


def silent_hosts(run: Run) -> list[int]:
    """Processes of ``run``'s current attempt whose heartbeat key in Redis expired (none when Redis
    cannot be asked)."""
    import redis

    from webapp.runs import channels

    processes = [host["process"] for host in run.placement.get("hosts", [])]
    try:
        client = channels.redis_client()
        try:
            alive = [client.exists(channels.host_key(run.public_id, run.attempt, process)) for process in processes]
        finally:
            client.close()
    except redis.RedisError:
        return []
    return [process for process, present in zip(processes, alive) if not present]


def lost_host_message(run: Run, *, step: int, lost: list[int] | None = None, silent_seconds: int | None = None) -> str:
    """Why a multi-host attempt failed: which hosts (process and worker) were lost. ``lost`` defaults to
    the hosts silent in Redis, else host 0 (whose reporter is the run's heartbeat)."""
    lost = lost if lost is not None else (silent_hosts(run) or [0])
    silent = f", silent for {silent_seconds} s" if silent_seconds is not None else ""
    return (f"{named_hosts(run, lost)} lost at step {step}{silent}; the other hosts were stopped. "
            "Resume the run to continue from its last checkpoint")
