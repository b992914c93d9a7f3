"""The train worker's side of a run: start an attempt, report its progress, record its end.

Design note: the engine calls ``on_progress`` on its training thread after every step, so that
callback only puts the step's record on an in-memory queue (no I/O, no locks beyond the queue's).
One writer thread per attempt does everything else, off the training thread:

- every ``FLUSH_SECONDS`` it drains the queue and bulk-inserts the metric points (one row per
  metric and step; ``ignore_conflicts`` on the unique (run, name, step) key, so a replay never
  duplicates), updates the run's progress fields, and publishes the batch on the run's Redis
  channel for live pages; it reads the lines the engine appended to the run directory's
  ``samples.jsonl`` since its last pass (generations at evaluations, and for GRPO/PPO every step's
  rollouts) into ``Sample`` rows; it folds every point into the run's min/max
  step buckets (``webapp.runs.downsampling``) and stores them on the run row every
  ``BUCKETS_SECONDS``, in the transaction that stores the points they cover, so that charts of a
  running run reduce only the points stored since;
- it publishes the engine's latest ``EvalProgress`` (``on_evaluation``, which only keeps it) as an
  ``evaluating`` event, and keeps it under ``channels.evaluating_key`` for pages loaded meanwhile, so
  that a page shows a long evaluation under way;
- every ``TEMPER_RUN_HEARTBEAT_SECONDS`` it refreshes the run's heartbeat (even while the engine
  compiles or evaluates and reports nothing) and re-reads ``Run.cancel_requested``;
- every ``CANCEL_POLL_SECONDS`` it reads the run's Redis cancel flag; ``should_stop`` (checked by
  the engine between steps) only reads the resulting ``threading.Event``.

Redis being away loses nothing: the database gets every point, and only the live push (and the
fast cancel path, the database flag still works) waits until Redis is back.

Resumed attempts: the engine drops metric lines logged after its last checkpoint and goes on with
the token count the checkpoint holds. The first step an attempt reports is therefore the first one it
computes anew; the writer deletes what an earlier attempt recorded from that step on (the engine
recomputes it) and adds each step's new tokens to the total recorded at the step before. Older
engines restarted the count at 0 on resume, and their run directories are still read (an engine
resuming one of their checkpoints goes on from the count logged at its step): a count lower than the
engine's count at the step before is such a restart, every token of it new (``TokenCount``).
A worker killed mid-run can die with points still queued for the database, for steps up to the
checkpoint the next attempt resumes from; those steps are never computed again, so the writer first
fills them in from the run directory's ``metrics.jsonl``, which the engine writes before each
checkpoint and which is therefore complete up to it; their samples come from a first pass over
``samples.jsonl`` (positions are counted in file order, so a sample stored before is not stored twice).

Samples are bounded in the database: at most ``ROLLOUTS_PER_STEP`` rollouts of a step are stored
(the first ones, whole prompt groups when it is a multiple of the group size), and a text longer
than ``SAMPLE_TEXT_CHARS`` is cut there (``extra.truncated_from`` keeps its length). The run
directory's ``samples.jsonl`` keeps every rollout in full; the samples browser pages what is stored.
"""
from __future__ import annotations

import json
import logging
import math
import queue
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Max, Min
from django.utils import timezone

from jaxengine.job import RunLogOnce, RunLogWarning, command_line_export
from jaxengine.words import counted
from webapp.core.text import storable_model_text
from webapp.runs import channels
from webapp.runs.artifacts import download_size
from webapp.runs.selectors import MAX_POINTS, last_point_id, last_value, series_buckets, series_cache_for
from webapp.runs.models import (
    Artifact, ArtifactKind, LogLevel, MetricPoint, Run, RunLogLine, RunStatus, Sample,
)
from webapp.runs.services import metric_names_note, metric_names_rewritten, publish_status

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 0.5
# How often the writer stores the run's downsampled buckets (``Run.series_cache``): pages reduce
# only the points stored since, so this bounds their work, not their freshness.
BUCKETS_SECONDS = 5.0
CANCEL_POLL_SECONDS = 0.5
INSERT_BATCH = 2000
# Keys of the engine's per-step record that are not metrics of their own.
NOT_METRICS = frozenset({"step"})
# Per step: 64 covers the presets' 4-8 prompts x 8 generations; samples.jsonl keeps the rest.
ROLLOUTS_PER_STEP = 64
SAMPLE_TEXT_CHARS = 4000
ROLLOUT = "rollout"


def run_start(*, run_pk: int, attempt: int, worker_name: str) -> Run | None:
    """Mark attempt ``attempt`` of the run as running on ``worker_name``; None when the message is
    stale (the run was cancelled, re-queued as a later attempt, or already finished)."""
    now = timezone.now()
    claimed = Run.objects.filter(pk=run_pk, attempt=attempt, status=RunStatus.QUEUED).update(
        status=RunStatus.RUNNING, worker_name=worker_name[:255], last_heartbeat=now, started_at=now,
        error_message="", notice="",  # the run's log keeps a lost attempt's notice
    )
    if not claimed:
        logger.info("run %s attempt %s: not queued as this attempt any more; message dropped", run_pk, attempt)
        return None
    run = Run.objects.get(pk=run_pk)
    RunLogLine.objects.create(run=run, message=f"attempt {attempt} started on {worker_name}")
    publish_status(run)  # an open run page shows the worker and its devices, not 'queued', from now on
    return run


@dataclass(frozen=True, kw_only=True)
class ProgressRecord:
    """What the writer needs of one engine ``Progress``, copied on the training thread."""

    step: int
    total_steps: int
    metrics: dict[str, Any]
    elapsed_seconds: float
    tokens_seen: int
    wall_time: float


def track_metric(summary: dict[str, dict[str, float]], name: str, value: float, step: int) -> None:
    """Fold one point into a run's ``final_metrics``: last (at the highest step), min and max."""
    entry = summary.get(name)
    if entry is None:
        summary[name] = {"last": value, "min": value, "max": value, "step": step}
        return
    if step >= entry["step"]:
        entry.update(last=value, step=step)
    entry.update(min=min(entry["min"], value), max=max(entry["max"], value))


def insert_metric_rows(rows: list[tuple[int, int, str, float, float, int]]) -> None:
    """Insert ``(run_id, step, name, value, wall_time, tokens)`` rows, skipping (run, name, step)
    pairs already stored. Plain ``executemany`` rather than model instances: the writer thread
    shares the GIL with the training thread, and building ORM objects was most of its CPU time.
    ``ON CONFLICT DO NOTHING`` is understood by SQLite (3.24+) and PostgreSQL alike."""
    quote = connection.ops.quote_name
    columns = ", ".join(quote(column) for column in ("run_id", "step", "name", "value", "wall_time", "tokens"))
    sql = (f"INSERT INTO {quote(MetricPoint._meta.db_table)} ({columns}) VALUES (%s, %s, %s, %s, %s, %s) "
           "ON CONFLICT DO NOTHING")
    with connection.cursor() as cursor:
        for start in range(0, len(rows), INSERT_BATCH):
            cursor.executemany(sql, rows[start:start + INSERT_BATCH])


def track_not_finite(latest: dict[str, dict[str, Any]], name: str, value: float, step: int) -> None:
    """Fold a NaN or infinite value of metric ``name`` at ``step`` into a run's ``not_finite_metrics``
    (the latest step each metric was logged not finite at, with the value as text: nan, inf, -inf)."""
    entry = latest.get(name)
    if entry is None or step >= entry["step"]:
        latest[name] = {"step": step, "value": str(float(value))}


def numeric_metrics(metrics: dict[str, Any]) -> Iterable[tuple[str, float]]:
    """The numeric metrics of one record, NaN and infinity included, in the record's order."""
    for name, value in metrics.items():
        if name in NOT_METRICS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        yield name, float(value)


def metric_values(metrics: dict[str, Any], *, not_finite: list[tuple[str, float]] | None = None
                  ) -> Iterable[tuple[str, float]]:
    """The finite numeric metrics of one record (NaN and infinity cannot be stored or plotted); the
    numeric ones left out for that go to ``not_finite`` (name, value) when it is given."""
    for name, value in numeric_metrics(metrics):
        if math.isfinite(value):
            yield name, value
        elif not_finite is not None:
            not_finite.append((name, value))


class AppendedLines:
    """The JSON lines appended to a file since the last ``read()``: complete lines only (the engine
    may be writing one), from the start again when the file shrank (a resume truncated it)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                if handle.seek(0, 2) < self.offset:
                    self.offset = 0
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        return [json.loads(line) for line in chunk[:end + 1].splitlines() if line.strip()]


@dataclass(kw_only=True)
class TokenCount:
    """A run's tokens over all its attempts, followed through the engine's counts step by step."""

    total: int = 0
    engine_count: int = 0  # what the engine reported at the last step added

    def add(self, engine_count: int) -> int:
        """Take the engine's count at the next step; returns the run's total there."""
        # Older engines restarted their count at 0 on resume: a count that went down is all new tokens.
        new_tokens = engine_count - self.engine_count if engine_count >= self.engine_count else engine_count
        self.total += new_tokens
        self.engine_count = engine_count
        return self.total


def read_metric_lines(metrics_path: Path, *, before_step: int) -> tuple[list[dict[str, Any]], TokenCount]:
    """The engine's per-step records in ``metrics.jsonl`` for steps below ``before_step``, each with
    its token count made the run's total (see the module notes), and the count after the last of them."""
    records, count = [], TokenCount()
    if not metrics_path.exists():
        return records, count
    with metrics_path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("step", before_step) < before_step:
                records.append({**record, "tokens": count.add(int(record.get("tokens", 0)))})
    return records, count


def sample_row(run: Run, step: int, position: int, record: dict[str, Any]) -> Sample:
    known = {"step", "prompt", "text", "answer", "rewards", "reward"}
    rewards = record.get("rewards") if isinstance(record.get("rewards"), dict) else {}
    reward = record.get("reward")
    if reward is None and rewards:
        reward = sum(value for value in rewards.values() if isinstance(value, (int, float)))
    text = storable_model_text(str(record.get("text", "")))
    extra = {key: value for key, value in record.items() if key not in known}
    if len(text) > SAMPLE_TEXT_CHARS:
        text, extra["truncated_from"] = text[:SAMPLE_TEXT_CHARS], len(text)
    return Sample(
        run=run, step=step, position=position, prompt=record.get("prompt", ""), text=text,
        answer=storable_model_text(str(record.get("answer") or "")), rewards=rewards,
        reward=reward if isinstance(reward, (int, float)) and math.isfinite(reward) else None,
        extra=extra,
    )


class RunReporter:
    """Reports one attempt of ``run`` from the train worker (see the module notes).

    ``start()`` before calling the engine with ``should_stop`` and ``on_progress``; ``close()``
    after it returns (or raises) flushes everything still queued."""

    def __init__(self, *, run: Run, flush_seconds: float = FLUSH_SECONDS,
                 heartbeat_seconds: float | None = None, use_redis: bool = True):
        self.run = run
        self.flush_seconds = flush_seconds
        self.heartbeat_seconds = heartbeat_seconds or settings.TEMPER_RUN_HEARTBEAT_SECONDS
        # Off only where no Redis is wanted (unit tests, the ingestion benchmark's DB-only figure).
        self.use_redis = use_redis
        self._samples = AppendedLines(run.output_dir / "samples.jsonl")
        self._sample_counts: dict[int, int] = {}  # step -> its records read so far (the next position)
        self._rollout_counts: dict[int, int] = {}
        self._samples_from_step = 0
        self._queue: queue.SimpleQueue[ProgressRecord] = queue.SimpleQueue()
        self._cancel = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"temper-report-{run.public_id}", daemon=True)
        self._first_step: int | None = None
        self._tokens = TokenCount()
        self._base_train_seconds = run.train_seconds
        self._attempt_started: float | None = None  # Unix time of the attempt's start (run_start), read at its first step
        self._summary_metrics: dict[str, dict[str, float]] = dict(run.final_metrics or {})
        self._not_finite: dict[str, dict[str, Any]] = dict(run.not_finite_metrics or {})
        self._evaluation: Any = None  # the engine's latest EvalProgress
        self._evaluation_published: Any = None
        self._redis: redis.Redis | None = None
        self._redis_warned = False
        self._buckets = None
        self._buckets_stored_at = 0.0
        self.points_written = 0
        self.error: BaseException | None = None

    # ---- engine callbacks (training thread) ---------------------------------------------

    def should_stop(self) -> bool:
        return self._cancel.is_set()

    def on_progress(self, progress: Any) -> None:
        self._queue.put(ProgressRecord(
            step=progress.step, total_steps=progress.total_steps, metrics=progress.metrics,
            elapsed_seconds=progress.elapsed_seconds, tokens_seen=progress.tokens_seen, wall_time=time.time(),
        ))

    def on_evaluation(self, evaluation: Any) -> None:
        # The engine's EvalProgress, after every eval batch: only the latest is kept (one assignment),
        # and the writer publishes it at its next pass.
        self._evaluation = evaluation

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the writer after it has written everything queued so far."""
        self._closing.set()
        self._thread.join()
        if self._redis is not None:
            self._redis.close()
        if self.error is not None:
            raise RuntimeError(f"reporting run {self.run.public_id} failed: {self.error}") from self.error

    def log(self, message: str, *, level: str = LogLevel.INFO) -> None:
        """Record and publish a log line (from any thread)."""
        line = RunLogLine.objects.create(run=self.run, message=message, level=level)
        self._publish({"type": "log", "lines": [log_line_payload(line)]})

    def log_engine_line(self, line: str) -> None:
        """The engine's ``on_log``: a line for the run's log (a resume's changed settings), its files named as
        the project names them (``in_project_terms``). A ``RunLogOnce`` line (what the encoding did to the data, said
        before the first step) is logged once: a resumed attempt encodes the same data again; a ``RunLogWarning``
        (what it cut or left out) as a warning."""
        message = in_project_terms(self.run, line)
        if not isinstance(line, RunLogOnce):
            self.log(message)
            return
        level = LogLevel.WARNING if isinstance(line, RunLogWarning) else LogLevel.INFO
        if not RunLogLine.objects.filter(run=self.run, level=level, message=message).exists():
            self.log(message, level=level)

    # ---- writer thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        next_heartbeat = next_cancel_poll = 0.0
        try:
            while True:
                closing = self._closing.wait(self.flush_seconds)
                records = self._drain()
                if records:
                    self._write(records)
                self._publish_evaluation()
                now = time.monotonic()
                if self.use_redis and now >= next_cancel_poll and not closing:
                    self._poll_cancel_flag()
                    next_cancel_poll = now + CANCEL_POLL_SECONDS
                if now >= next_heartbeat and not closing:
                    self._heartbeat()
                    next_heartbeat = now + self.heartbeat_seconds
                if closing and self._queue.empty():
                    if self._buckets is not None:
                        self._store_buckets()
                    return
        except BaseException as error:  # surfaced by close(); the run is then marked failed
            logger.exception("run %s: reporting failed", self.run.public_id)
            self.error = error
            self._cancel.set()
        finally:
            connection.close()

    def _publish_evaluation(self) -> None:
        # An evaluation runs before its step's progress is reported: "evaluating" tells the run page it has
        # not stopped (the page shows it until that step's progress arrives).
        evaluation = self._evaluation
        if evaluation is None or evaluation == self._evaluation_published:
            return
        self._evaluation_published = evaluation
        event = {"type": "evaluating", "step": evaluation.step, "batches_done": evaluation.batches_done,
                 "batches": evaluation.batches, "generating": evaluation.generating}
        self._publish(event)
        # Kept too, for a page loaded mid-evaluation (selectors.run_evaluating): one SET per flush at most.
        if self.use_redis:
            try:
                self._client().set(channels.evaluating_key(self.run.public_id), json.dumps(event),
                                   ex=channels.EVALUATING_SECONDS)
            except redis.RedisError as error:
                self._redis_failed(error)

    def _drain(self) -> list[ProgressRecord]:
        records = []
        while True:
            try:
                records.append(self._queue.get_nowait())
            except queue.Empty:
                return records

    def _begin_attempt(self, first_step: int) -> None:
        self._first_step = first_step
        # Read here, not from the run given: a multi-host attempt's process 0 is given the row as it was before
        # run_start set this attempt's start.
        started_at = Run.objects.filter(pk=self.run.pk).values_list("started_at", flat=True).first()
        self._attempt_started = None if started_at is None else started_at.timestamp()
        # The engine recomputes every step from ``first_step`` on: drop what an earlier attempt
        # recorded there, and continue the token count from the step before. The run's stored
        # buckets are rebuilt in the same transaction, so no page sees them cover deleted points.
        with transaction.atomic():
            MetricPoint.objects.filter(run=self.run, step__gte=first_step).delete()
            Sample.objects.filter(run=self.run, step__gte=first_step).delete()
            self._not_finite = {name: entry for name, entry in self._not_finite.items() if entry["step"] < first_step}
            if first_step > 1:
                logged, logged_count = read_metric_lines(self.run.output_dir / "metrics.jsonl",
                                                         before_step=first_step)
                self._fill_lost_steps(logged)
                previous = MetricPoint.objects.filter(run=self.run, name="tokens", step=first_step - 1).first()
                total = int(previous.value) if previous else self.run.tokens_seen
                # The engine goes on from the count it logged at the step before; with no line there,
                # from the run's total, which that count is unless an older engine once restarted it.
                logged_before = bool(logged) and logged[-1]["step"] == first_step - 1
                engine_count = logged_count.engine_count if logged_before else total
                self._tokens = TokenCount(total=total, engine_count=engine_count)
            self.run.current_step = first_step - 1
            # Each metric's latest and range, as the table, the compare page and Tokens/s read them, without
            # the deleted steps: the old latest, at a later step, held until this attempt passed it. Saved now, in
            # the transaction that deleted the points: a metric only those held leaves the sort menu with them.
            self._summary_metrics = metric_summary(self.run)
            before = Run.objects.filter(pk=self.run.pk).values_list("final_metrics", flat=True).get() or {}
            self.run.final_metrics = dict(self._summary_metrics)
            Run.objects.filter(pk=self.run.pk).update(final_metrics=self.run.final_metrics)
            metric_names_rewritten(run=self.run, before=before)
            self._buckets = series_buckets(run=self.run, reuse_stored=False)
            self._store_buckets()
            self._buckets_stored_at = time.monotonic()
            # Earlier steps' samples are stored, except perhaps those of the last one stored and
            # of the lost steps after it: the first pass over samples.jsonl stores those.
            self._samples_from_step = Sample.objects.filter(run=self.run).aggregate(last=Max("step"))["last"] or 0
        if first_step > 1:
            self.log(f"resumed: continuing from step {first_step - 1}")

    def _fill_lost_steps(self, logged: list[dict[str, Any]]) -> None:
        """Store the steps of ``logged`` (``read_metric_lines``' records before the first step this
        attempt computes) that an earlier attempt computed but never got into the database (see the
        module notes)."""
        stored = set(MetricPoint.objects.filter(run=self.run).values_list("step", flat=True).distinct())
        lost = [record for record in logged if record["step"] not in stored]
        if not lost:
            return
        latest = MetricPoint.objects.filter(run=self.run).aggregate(Max("wall_time"))["wall_time__max"]
        wall_time = latest if latest is not None else time.time()
        rows = []
        for record in lost:
            not_finite: list[tuple[str, float]] = []
            for name, value in metric_values(record, not_finite=not_finite):
                rows.append((self.run.pk, record["step"], name, value, wall_time, record["tokens"]))
                self._track(name, value, record["step"])
            for name, value in not_finite:
                track_not_finite(self._not_finite, name, value, record["step"])
        insert_metric_rows(rows)
        Run.objects.filter(pk=self.run.pk).update(not_finite_metrics=self._not_finite)
        self.log(f"recovered steps {lost[0]['step']}-{lost[-1]['step']} from the run directory")

    def _write(self, records: list[ProgressRecord]) -> None:
        if self._first_step is None:
            self._begin_attempt(records[0].step)
        points = []
        payload = []
        eval_steps = []
        for record in records:
            tokens = self._tokens.add(int(record.metrics.get("tokens", record.tokens_seen)))
            not_finite: list[tuple[str, float]] = []
            for name, value in metric_values(record.metrics, not_finite=not_finite):
                if name == "tokens":
                    value = float(tokens)
                points.append((self.run.pk, record.step, name, value, record.wall_time, tokens))
                self._buckets.add(name, record.step, value, tokens, record.wall_time)
                payload.append({"step": record.step, "name": name, "value": value, "tokens": tokens,
                                "wall_time": record.wall_time})
                self._track(name, value, record.step)
            for name, value in not_finite:
                track_not_finite(self._not_finite, name, value, record.step)
            if any(name.startswith("eval/") for name in record.metrics):
                eval_steps.append(record.step)
        last = records[-1]
        tokens_seen = self._tokens.total
        # Counted from the attempt's start, as the run page counts while the attempt starts (views._progress): the
        # engine's clock starts after the model is loaded, and Elapsed stepped back by that at the first step.
        attempt_seconds = last.elapsed_seconds if self._attempt_started is None else max(
            last.elapsed_seconds, last.wall_time - self._attempt_started)
        train_seconds = self._base_train_seconds + attempt_seconds
        self._buckets.fit(self._buckets.through_step, MAX_POINTS)
        now = time.monotonic()
        store_buckets = now - self._buckets_stored_at >= BUCKETS_SECONDS
        with transaction.atomic():
            insert_metric_rows(points)
            Run.objects.filter(pk=self.run.pk).update(
                current_step=last.step, total_steps=last.total_steps, tokens_seen=tokens_seen,
                train_seconds=train_seconds, last_heartbeat=timezone.now(), final_metrics=self._summary_metrics,
                not_finite_metrics=self._not_finite,
            )
            metric_names_note(project_id=self.run.project_id, names={point[2] for point in points})
            if store_buckets:
                self._store_buckets()
                self._buckets_stored_at = now
        self.points_written += len(points)
        self.run.current_step, self.run.tokens_seen = last.step, tokens_seen
        self._publish({"type": "metrics", "points": payload})
        speed = last_value(final_metrics=self._summary_metrics, name="tokens_per_second")
        self._publish({"type": "progress", "step": last.step, "total_steps": last.total_steps,
                       "tokens": tokens_seen, "train_seconds": train_seconds, "tokens_per_second": speed})
        # The engine wrote a step's samples before reporting the step: they are in the file now.
        evaluated = self._write_samples()
        for step in eval_steps:
            metrics = next(r for r in records if r.step == step).metrics
            # Not each group of data.eval_group_by (eval/<metric>/<group>, up to 32 a metric): the charts show those.
            # NaN and infinity too (as nan, inf): charts cannot show them, and an evaluation gone NaN is news.
            evaluation = ", ".join(f"{name} {value:.4g}" for name, value in numeric_metrics(metrics)
                                   if name.startswith("eval/") and name.count("/") == 1)
            count = evaluated.get(step, 0)
            self.log(f"step {step}: evaluated ({evaluation}" + (f"; {counted(count, 'sample')})" if count else ")"))

    def _write_samples(self) -> dict[int, int]:
        """Store the samples appended to samples.jsonl since the last pass (within the bounds of the
        module notes); returns how many generations (not rollouts) each step got."""
        rows, evaluated, steps = [], {}, set()
        for record in self._samples.read():
            step = int(record.get("step", 0))
            position = self._sample_counts.get(step, 0)
            self._sample_counts[step] = position + 1
            if step < self._samples_from_step:
                continue
            if record.get("kind") == ROLLOUT:
                self._rollout_counts[step] = self._rollout_counts.get(step, 0) + 1
                if self._rollout_counts[step] > ROLLOUTS_PER_STEP:
                    continue
            else:
                evaluated[step] = evaluated.get(step, 0) + 1
            rows.append(sample_row(self.run, step, position, record))
            steps.add(step)
        if rows:
            Sample.objects.bulk_create(rows, ignore_conflicts=True, batch_size=500)
            self._publish({"type": "samples", "step": max(steps), "count": len(rows)})
        return evaluated

    def _store_buckets(self) -> None:
        """Store the buckets with the id of the newest point they cover (the writer's own last
        insert: this thread is the run's only writer of points)."""
        self._buckets.through_id = last_point_id(run=self.run)
        Run.objects.filter(pk=self.run.pk).update(series_cache={"buckets": self._buckets.to_json()})

    def _track(self, name: str, value: float, step: int) -> None:
        track_metric(self._summary_metrics, name, value, step)

    def _heartbeat(self) -> None:
        close_old_connections()
        mine = Run.objects.filter(pk=self.run.pk, attempt=self.run.attempt, status=RunStatus.RUNNING)
        if not mine.update(last_heartbeat=timezone.now()):
            # The run was taken from this attempt (declared lost and re-queued): stop, keep out of its way.
            logger.warning("run %s: attempt %s is no longer current; stopping", self.run.public_id, self.run.attempt)
            self._cancel.set()
        elif mine.filter(cancel_requested=True).exists():
            self._cancel.set()

    # ---- Redis ------------------------------------------------------------------------------

    def _client(self) -> redis.Redis:
        if self._redis is None:
            self._redis = channels.redis_client()
        return self._redis

    def _redis_failed(self, error: redis.RedisError) -> None:
        if not self._redis_warned:
            logger.warning("run %s: Redis unavailable (%s); live updates wait, the database has every point",
                           self.run.public_id, error)
            self._redis_warned = True

    def _poll_cancel_flag(self) -> None:
        try:
            if self._client().exists(channels.cancel_key(self.run.public_id)):
                self._cancel.set()
            self._redis_warned = False
        except redis.RedisError as error:
            self._redis_failed(error)

    def _publish(self, event: dict[str, Any]) -> None:
        if not self.use_redis:
            return
        try:
            self._client().publish(channels.events_channel(self.run.public_id), json.dumps(event))
        except redis.RedisError as error:
            self._redis_failed(error)


def log_line_payload(line: RunLogLine) -> dict[str, Any]:
    """A log line as the run page reads it (its live events, its polling, the REST API's logs/)."""
    return {"id": line.pk, "time": line.created_at.isoformat(), "level": line.level, "message": line.message}


def metric_summary(run: Run) -> dict[str, dict[str, float]]:
    """Last, min and max of every metric of ``run`` from its stored points."""
    summary: dict[str, dict[str, float]] = {}
    ranges = MetricPoint.objects.filter(run=run).values("name").annotate(
        low=Min("value"), high=Max("value"), last_step=Max("step"))
    for row in ranges:
        last = MetricPoint.objects.get(run=run, name=row["name"], step=row["last_step"])
        summary[row["name"]] = {"last": last.value, "min": row["low"], "max": row["high"], "step": row["last_step"]}
    return summary


@transaction.atomic
def run_finish(*, run: Run, summary: dict[str, Any]) -> Run:
    """Record the engine's summary: final status and message, artifacts (exported model, adapter),
    final metrics recomputed from the stored points. Ignored when the attempt is no longer current."""
    current = _current_attempt(run)
    if current is None:
        return run
    run = current
    status = summary.get("status")
    run.status = status if status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED) else RunStatus.FAILED
    run.error_message = in_project_terms(run, summary.get("message") or "")
    run.summary = summary
    run.finished_at = timezone.now()
    run.current_step = int(summary.get("step", run.current_step))
    before = run.final_metrics
    run.final_metrics = metric_summary(run)
    run.last_heartbeat = run.finished_at
    run.series_cache = series_cache_for(run)
    run.save(update_fields=["status", "error_message", "summary", "finished_at", "current_step", "final_metrics",
                            "last_heartbeat", "series_cache"])
    metric_names_rewritten(run=run, before=before)
    for kind, key in ((ArtifactKind.MODEL, "model"), (ArtifactKind.ADAPTER, "adapter")):
        path = (summary.get("export") or {}).get(key)
        if path and Path(path).is_dir():
            # One export a run (the engine writes it over the last): it is recorded with the step it holds.
            Artifact.objects.filter(run=run, kind=kind).exclude(step=run.current_step).delete()
            Artifact.objects.update_or_create(run=run, kind=kind, step=run.current_step,
                                              defaults={"path": str(Path(path).resolve()),
                                                        "size_bytes": download_size(Path(path), kind=kind)})
    outcome = f"{run.status} at step {run.current_step}"
    # The engine's own message often says just that ("cancelled at step 129"): it is not said twice.
    message = outcome if run.error_message in ("", outcome) else f"{outcome}: {run.error_message}"
    RunLogLine.objects.create(run=run, message=message,
                              level=LogLevel.INFO if run.status == RunStatus.SUCCEEDED else LogLevel.WARNING)
    publish_status(run)
    return run


def in_project_terms(run: Run, message: str) -> str:
    """The engine's ``message`` about ``run`` with the files it was given named as the project names them:
    a dataset version's file as the version ("row 3 of questions v1 has no 'answer' column", not a path
    under the data root nobody chose), the starting model's directory as the base model or run. The command line's
    way to a new run from one of the run's checkpoints (``jaxengine.job.command_line_export``) is left out: the
    message names the run page's action for it, and a user of the web has no shell on the server."""
    if output_dir := (run.resolved_spec or {}).get("output_dir"):
        for step in set(re.findall(r"--step (\d+)", message)):
            message = message.replace(command_line_export(Path(output_dir), int(step)), "")
    names = {str(version.absolute_path): str(version) for version in run.dataset_versions.select_related("dataset")}
    model_path = (run.resolved_spec or {}).get("model")
    if isinstance(model_path, str) and model_path:
        # A run started from a run also records the base model at the root of the chain: the run comes first.
        if run.source_run is not None:
            names[model_path] = f"the model of run {run.source_run.name} ({run.source_run.public_id})"
        elif run.base_model is not None:
            names[model_path] = f"base model {run.base_model.name}"
    for path in sorted(names, key=len, reverse=True):  # a longer path first: one may hold another
        message = message.replace(path, names[path])
    return message


@transaction.atomic
def checkpoint_exported(*, run: Run, step: int, export_dir: Path) -> Artifact:
    """Register checkpoint ``step`` of ``run``, exported to ``export_dir``, as a starting model."""
    artifact, _ = Artifact.objects.update_or_create(
        run=run, kind=ArtifactKind.CHECKPOINT, step=step,
        defaults={"path": str(export_dir.resolve()),
                  "size_bytes": download_size(export_dir, kind=ArtifactKind.CHECKPOINT)})
    RunLogLine.objects.create(run=run, message=f"checkpoint {step} exported to {export_dir}; start runs from {run.public_id}@{step}")
    return artifact


def checkpoint_export_failed(*, run: Run, step: int, reason: str) -> None:
    RunLogLine.objects.create(run=run, level=LogLevel.ERROR, message=f"export of checkpoint {step} failed: {reason}"[:4000])


@transaction.atomic
def run_fail(*, run: Run, error: BaseException) -> Run:
    """Mark the run failed with ``error`` (the engine raised instead of returning a summary).
    Ignored when the attempt is no longer current."""
    current = _current_attempt(run)
    if current is None:
        return run
    return _failed(current, message=in_project_terms(current, f"{type(error).__name__}: {error}")[:4000])


def _failed(run: Run, *, message: str) -> Run:
    """The current attempt ``run`` (locked) ended failed with ``message``: its metrics' summary and charts kept, the
    reason logged and the pages told."""
    run.status = RunStatus.FAILED
    run.error_message = message
    run.finished_at = timezone.now()
    before = run.final_metrics
    run.final_metrics = metric_summary(run)
    run.series_cache = series_cache_for(run)
    run.save(update_fields=["status", "error_message", "finished_at", "final_metrics", "series_cache"])
    metric_names_rewritten(run=run, before=before)
    RunLogLine.objects.create(run=run, message=f"failed: {run.error_message}", level=LogLevel.ERROR)
    publish_status(run)
    return run


@transaction.atomic
def host_start(*, run_pk: int, attempt: int, process_id: int, worker_name: str) -> Run | None:
    """Start process ``process_id`` of a multi-host run's attempt: acknowledge it on the run's
    placement (``placement["started"]``: an attempt whose hosts do not all start in time is placed
    again, ``webapp.runs.placement``); process 0 also claims the run as ``run_start`` does (its
    reporter is the run's). None, with the reason logged, when the message is stale: the attempt is
    not the run's placed, active one any more, or this process of it already started."""
    run = Run.objects.select_for_update(of=("self",)).filter(pk=run_pk).first()
    stale = _stale_host_message(run, attempt=attempt, process_id=process_id)
    if stale is None and process_id == 0 and run_start(run_pk=run_pk, attempt=attempt, worker_name=worker_name) is None:
        stale = f"run is {run.status}, not queued"
    if stale is not None:
        logger.info("run %s attempt %s: host %s message dropped: %s", run_pk, attempt, process_id, stale)
        return None
    run.placement["started"] = sorted({*run.placement.get("started", []), process_id})
    run.save(update_fields=["placement"])
    if process_id != 0:
        RunLogLine.objects.create(run=run, message=f"attempt {attempt}: host {process_id} started on {worker_name}")
    return Run.objects.get(pk=run_pk)


def _stale_host_message(run: Run | None, *, attempt: int, process_id: int) -> str | None:
    """Why a host message for ``attempt`` must not start (None when it may): said in the log."""
    if run is None:
        return "no such run"
    if run.attempt != attempt:
        return f"run is at attempt {run.attempt}"
    if not run.is_active:
        return f"run is {run.status}"
    if run.placement.get("attempt") != attempt:
        return "attempt is not placed"
    if process_id in run.placement.get("started", []):
        return "this process already started"
    return None


@transaction.atomic
def run_fail_hosts_lost(*, run: Run, lost: list[int]) -> Run | None:
    """Mark a multi-host attempt failed because hosts ``lost`` (process indices) were lost; the first
    process to notice records it, later verdicts on the same attempt change nothing."""
    from webapp.runs.placement import lost_host_message

    current = Run.objects.select_for_update(of=("self",)).filter(
        pk=run.pk, attempt=run.attempt, status__in=(RunStatus.QUEUED, RunStatus.RUNNING)).first()
    if current is None:
        return None
    return _failed(current, message=lost_host_message(current, step=current.current_step, lost=lost))


def _current_attempt(run: Run) -> Run | None:
    """The run's row, locked, if ``run``'s attempt is still the running one."""
    current = Run.objects.select_for_update(of=("self",)).filter(
        pk=run.pk, attempt=run.attempt, status=RunStatus.RUNNING).first()
    if current is None:
        logger.warning("run %s: attempt %s was superseded; its outcome is not recorded", run.public_id, run.attempt)
    return current


def publish_event(public_id: str, event: dict[str, Any]) -> None:
    """Publish one live event on a run's channel with a short-lived connection; Redis being away
    only costs the live update (the database has everything)."""
    try:
        client = channels.redis_client()
        try:
            client.publish(channels.events_channel(public_id), json.dumps(event))
        finally:
            client.close()
    except redis.RedisError as error:
        logger.warning("run %s: %s event not published: %s", public_id, event.get("type"), error)

