"""Messages whose worker died holding them, handed on at once instead of an hour later.

Every task is acknowledged late (``CELERY_TASK_ACKS_LATE``): Redis keeps a delivered message in kombu's
``unacked`` hash, with its delivery time in the ``unacked_index`` sorted set, until its task ends. A worker
killed outright (SIGKILL, its host or container gone) leaves the message there, and Celery's Redis
transport gives it to another worker only after its visibility timeout, an hour by default: an hour in
which a dataset stays "validating", a checkpoint "exporting", a review campaign "generating".

Each worker's heartbeat lists the deliveries it holds (``Worker.deliveries``: running or reserved). The
reaper (``worker/reaper.py``) restores a delivery made over ``TEMPER_RUN_LOST_SECONDS`` ago that no live
worker holds, through kombu's own restore (what the visibility timeout would do): the task runs again on
a live worker. Runs are not special here: a lost run's next attempt comes from its heartbeat
(``runs.services.runs_reap_lost``), and a train message of an attempt that is no longer queued is
dropped by the worker that takes it.

- A message is restored this way once. One that was delivered again already and lost its worker again
  may be what kills its workers (memory); it is left to the visibility timeout, and the checks that settle work
  whose message Redis holds nowhere count it as lost meanwhile (``abandoned_tags``).
- Messages on a worker's own queue (``<name>.dq2``) are left too: they go to that worker only, and
  multi-host placement (``webapp.runs.placement``) places a lost host's job again.
- It needs heartbeats on every worker: where ``TEMPER_HEARTBEAT_SECONDS`` is 0 nothing is restored.
- The object whose work was restored says so (``FIRST_LOSS_NOTES``): which worker was lost, when it was last heard
  from, and that the work starts over on the next free worker. Until then a first loss went unsaid, and a check,
  a load or an export that took twice as long as it should looked like one still going.
"""
from __future__ import annotations

import ast
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timezone as dt_timezone

import redis
from django.conf import settings
from django.utils import timezone
from django.utils.module_loading import import_string

from webapp.core.templatetags.temper import when
from webapp.runs import channels
from webapp.workers.models import FORGET_AFTER, Worker, stale_after

logger = logging.getLogger(__name__)

# Celery's Redis transport keeps waiting messages in a list named after the queue (priority levels in
# lists named queue + SEP + level), delivered, unacknowledged ones in a hash and their delivery times
# (seconds since the epoch) in a sorted set.
KOMBU_PRIORITY_SEP = "\x06\x16"
KOMBU_UNACKED_KEY = "unacked"
KOMBU_UNACKED_INDEX_KEY = "unacked_index"
DIRECT_EXCHANGE = "C.dq2"


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """A message Redis keeps as delivered to a worker, not yet acknowledged."""

    tag: str
    task: str
    arguments: str  # Celery's argsrepr
    exchange: str
    delivered_at: float
    redelivered: bool


def unacked_deliveries(client: redis.Redis) -> list[Delivery]:
    """Every delivered, unacknowledged message Redis holds, oldest first."""
    delivered_at = {_text(tag): score for tag, score in client.zrange(KOMBU_UNACKED_INDEX_KEY, 0, -1, withscores=True)}
    deliveries = []
    for tag, raw in client.hgetall(KOMBU_UNACKED_KEY).items():
        tag = _text(tag)
        try:
            payload, exchange, _routing_key = json.loads(raw)
            headers = payload.get("headers") or {}
        except (ValueError, TypeError, AttributeError):  # not a message Celery wrote: not ours to judge
            continue
        delivery_info = (payload.get("properties") or {}).get("delivery_info") or {}
        deliveries.append(Delivery(
            tag=tag, task=str(headers.get("task", "")), arguments=str(headers.get("argsrepr", "")),
            exchange=exchange or "",
            # A delivery whose time is missing (between kombu's two writes) counts as just made.
            delivered_at=delivered_at.get(tag, float("inf")),
            redelivered=bool(headers.get("redelivered") or delivery_info.get("redelivered")),
        ))
    return sorted(deliveries, key=lambda delivery: delivery.delivered_at)


def orphans(deliveries: list[Delivery], *, held: set[str], delivered_before: float) -> list[Delivery]:
    """The deliveries to restore: made before ``delivered_before``, held by no live worker, not on a
    worker's own queue and not delivered again already."""
    return [delivery for delivery in deliveries
            if delivery.delivered_at < delivered_before and delivery.tag not in held
            and delivery.exchange != DIRECT_EXCHANGE and not delivery.redelivered]


def abandoned_tags(client: redis.Redis, *, now: datetime | None = None) -> set[str]:
    """The tags of the deliveries that lost their worker after having been delivered once before: ``orphans`` leaves
    them to Celery's visibility timeout (an hour), since the message may be what kills its workers. Held by no live
    worker for over ``TEMPER_RUN_LOST_SECONDS``, they are lost for the checks that settle work whose message Redis
    holds nowhere (``runs.services.held_task_messages``), as a first loss is queued again by then. Empty where
    nothing tells (heartbeats off)."""
    if settings.TEMPER_HEARTBEAT_SECONDS <= 0:
        return set()
    now = now or timezone.now()
    held = live_worker_deliveries(now=now)
    cutoff = now.timestamp() - settings.TEMPER_RUN_LOST_SECONDS
    return {delivery.tag for delivery in unacked_deliveries(client)
            if delivery.redelivered and delivery.tag not in held and delivery.delivered_at < cutoff
            and delivery.exchange != DIRECT_EXCHANGE}


def live_worker_deliveries(*, now: datetime) -> set[str]:
    """The delivery tags that workers heard from within ``stale_after()`` (and not stopped) hold."""
    rows = Worker.objects.filter(stopped_at__isnull=True, last_seen__gte=now - stale_after())
    return {str(tag) for deliveries in rows.values_list("deliveries", flat=True) for tag in deliveries}


def deliveries_restore_orphaned(*, now: datetime | None = None) -> list[Delivery]:
    """Give each delivery whose worker died (``orphans``) back to its queue now; returns them. Safe from
    many reapers at once: kombu restores a tag in a transaction that watches the hash, so a message is
    queued again once, and not at all if its worker acknowledged it meanwhile."""
    if settings.TEMPER_HEARTBEAT_SECONDS <= 0:
        return []
    now = now or timezone.now()
    held = live_worker_deliveries(now=now)
    try:
        client = channels.redis_client()
        try:
            lost = orphans(unacked_deliveries(client), held=held,
                           delivered_before=now.timestamp() - settings.TEMPER_RUN_LOST_SECONDS)
        finally:
            client.close()
        if lost:
            _restore(lost)
    except redis.RedisError as error:
        logger.warning("deliveries of lost workers not checked, Redis unavailable: %s", error)
        return []
    for delivery in lost:
        logger.warning("%s %s: its worker was lost holding it; queued again", delivery.task, delivery.arguments)
    _note_first_losses(lost, now=now)
    return lost


# The service that writes, on the object a task works on, that its message was queued again after its worker was
# lost (``LostWorker.note``): called with the task's arguments (as a tuple) and the ``LostWorker``, it writes only
# while the object still waits for that work. By dotted path: the apps' services import this module. Runs and
# review generations are not here: their heartbeats settle them first (``runs.services.runs_reap_lost``,
# ``review.services.generations_settle_lost``), with more to say (the checkpoint, the answers so far).
FIRST_LOSS_NOTES = {
    "worker.tasks.datasets.validate_dataset_version": "webapp.datasets.services.version_check_requeued",
    "worker.tasks.datasets.compute_token_statistics": "webapp.datasets.services.token_statistics_requeued",
    "worker.tasks.datasets.derive_dataset_version": "webapp.datasets.services.derivation_requeued",
    "worker.tasks.review.load_campaign_items": "webapp.review.services.campaign_load_requeued",
    "worker.tasks.review.write_export": "webapp.review.services.export_requeued",
    "worker.tasks.train.export_checkpoint": "webapp.runs.services.checkpoint_export_requeued",
    "worker.tasks.train.export_stage": "webapp.runs.pipelines.export_stage_requeued",
    "worker.tasks.serve.make_serving_copy": "webapp.runs.serving_copies.serving_copy_requeued",
    "worker.tasks.serve.quantize_run": "webapp.runs.serving_copies.automatic_copy_requeued",
    "worker.tasks.evals.run_evaluation": "webapp.evals.services.evaluation_requeued",
}


@dataclass(frozen=True, kw_only=True)
class LostWorker:
    """The worker that died holding a delivery: its name and when it was last heard from where a silent worker's
    heartbeat listed the delivery (None where it died before a heartbeat said it held it), and when it took it."""

    name: str | None
    last_seen: datetime | None
    delivered_at: datetime

    def note(self, *, doing: str, work: str) -> str:
        """What the object says, e.g. ``doing`` "checking this file", ``work`` "the check"."""
        who = (f"{self.name}, last heard from at {when(self.last_seen)}" if self.name
               else f"which took it at {when(self.delivered_at)} and was not heard from since")
        return (f"the worker {doing} ({who}) was lost: killed, out of memory, or its host lost; {work} was queued "
                "again and starts over on the next free worker")


def _note_first_losses(restored: list[Delivery], *, now: datetime) -> None:
    """Have the object of each restored delivery say that its worker was lost (``FIRST_LOSS_NOTES``). A note that
    fails is logged: the message is queued again all the same."""
    noted = [delivery for delivery in restored if delivery.task in FIRST_LOSS_NOTES]
    if not noted:
        return
    holders = {}
    for worker in Worker.objects.filter(last_seen__gte=now - FORGET_AFTER).only("name", "last_seen", "deliveries"):
        for tag in worker.deliveries:
            holders[str(tag)] = worker
    for delivery in noted:
        arguments = _arguments(delivery)
        if arguments is None:
            continue
        holder = holders.get(delivery.tag)
        lost = LostWorker(name=holder.name if holder else None, last_seen=holder.last_seen if holder else None,
                          delivered_at=datetime.fromtimestamp(delivery.delivered_at, tz=dt_timezone.utc))
        try:
            import_string(FIRST_LOSS_NOTES[delivery.task])(arguments, lost=lost)
        except Exception:  # the note is a courtesy: the work itself is queued again
            logger.exception("%s %s: its first loss could not be noted", delivery.task, delivery.arguments)


@dataclass(frozen=True, kw_only=True)
class TaskDeliveries:
    """Where the delivered messages of one task are, by their arguments (``argsrepr`` read back)."""

    live: frozenset[tuple]  # held by a worker heard from within ``stale_after()``: running or reserved there
    orphaned: dict[tuple, Delivery]  # held by no live worker: its worker died (or has yet to beat)

    def abandoned(self, *, delivered_before: datetime) -> set[tuple]:
        """The arguments of the messages that lost their worker after having been delivered once before
        (``abandoned_tags``' rule), delivered before ``delivered_before``."""
        return {arguments for arguments, delivery in self.orphaned.items()
                if delivery.redelivered and delivery.delivered_at < delivered_before.timestamp()}


def task_deliveries(*, task: str, now: datetime | None = None) -> TaskDeliveries | None:
    """The delivered messages of ``task`` that a live worker holds and those it does not, for the checks that
    settle the work of a worker that died in the middle of it (``review.services.generations_settle_lost``). None
    where nothing tells: heartbeats off (no worker lists what it holds), or Redis cannot be asked."""
    if settings.TEMPER_HEARTBEAT_SECONDS <= 0:
        return None
    now = now or timezone.now()
    held = live_worker_deliveries(now=now)
    try:
        client = channels.redis_client()
        try:
            deliveries = unacked_deliveries(client)
        finally:
            client.close()
    except redis.RedisError as error:
        logger.warning("deliveries of %s not checked, Redis unavailable: %s", task, error)
        return None
    live, orphaned = set(), {}
    for delivery in deliveries:
        if delivery.task != task or (arguments := _arguments(delivery)) is None:
            continue
        if delivery.tag in held:
            live.add(arguments)
        else:
            orphaned[arguments] = delivery
    return TaskDeliveries(live=frozenset(live), orphaned=orphaned)


def _restore(deliveries: list[Delivery]) -> None:
    from webapp.celery import app as celery_app

    with celery_app.connection_for_write() as connection:
        qos = connection.default_channel.qos
        for delivery in deliveries:
            qos.restore_by_tag(delivery.tag)


def _arguments(delivery: Delivery) -> tuple | None:
    """A delivery's task arguments, read back from Celery's ``argsrepr`` (ids only: None for anything else)."""
    try:
        arguments = ast.literal_eval(delivery.arguments)
    except (ValueError, SyntaxError):
        return None
    if isinstance(arguments, (list, tuple)) and all(isinstance(item, (int, float, str)) for item in arguments):
        return tuple(arguments)
    return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
