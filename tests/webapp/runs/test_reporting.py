"""The train worker's reporter, driven with engine-like progress records on a real (file) test
database from its own writer thread: points, progress, samples, resume continuity, cancel."""
import json
import math
from dataclasses import dataclass

import pytest

from jaxengine.job import RunLogWarning
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.runs import reporting, selectors, services
from webapp.runs.models import Artifact, ArtifactKind, LogLevel, MetricPoint, Run, RunStatus, Sample


@dataclass(frozen=True)
class Progress:  # the engine's jaxengine.trainer.Progress, field for field
    step: int
    total_steps: int
    metrics: dict
    elapsed_seconds: float
    tokens_seen: int


@dataclass(frozen=True)
class EvalProgress:  # the engine's jaxengine.trainer.EvalProgress, field for field
    step: int
    batches_done: int
    batches: int
    generating: bool = False


def record(step: int, *, tokens_per_step: int = 100, offset_steps: int = 0, **extra) -> Progress:
    """Step ``step``'s progress with a token count from step ``offset_steps`` on: the engine counts from
    0 (the whole run); an older engine restarted its count at the step it resumed after."""
    tokens = (step - offset_steps) * tokens_per_step
    metrics = {"step": step, "loss": 10.0 / step, "learning_rate": 1e-3, "tokens": tokens, "epoch": 0, **extra}
    return Progress(step=step, total_steps=10, metrics=metrics, elapsed_seconds=step * 0.5, tokens_seen=tokens)


@pytest.fixture
def running_run(transactional_db, monkeypatch):
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    team = make_team()
    spec = {"task": "sft", "model": make_base_model(team.project).public_id,
            "data": {"train": make_ready_version(team.project).public_id}, "train": {"max_steps": 10}}
    run = services.run_create(project=team.project, spec=spec, user=team.owner)
    started = reporting.run_start(run_pk=run.pk, attempt=1, worker_name="train@test")
    assert started is not None and started.status == RunStatus.RUNNING
    return started


def report(run, records, **kwargs) -> reporting.RunReporter:
    reporter = reporting.RunReporter(run=run, flush_seconds=0.05, use_redis=False, **kwargs)
    reporter.start()
    for item in records:
        reporter.on_progress(item)
    reporter.close()
    return reporter


def test_a_stale_message_is_dropped(running_run):
    assert reporting.run_start(run_pk=running_run.pk, attempt=1, worker_name="other") is None
    assert reporting.run_start(run_pk=running_run.pk, attempt=2, worker_name="other") is None


def test_it_writes_points_progress_and_summary(running_run):
    reporter = report(running_run, [record(step, bad=math.nan) for step in range(1, 6)])
    points = MetricPoint.objects.filter(run=running_run)
    assert reporter.points_written == 5 * 4 and points.count() == 20  # loss, learning_rate, tokens, epoch; NaN dropped
    assert list(points.filter(name="loss").order_by("step").values_list("value", flat=True)) == [10.0, 5.0, 10 / 3, 2.5, 2.0]
    assert list(points.filter(name="loss").order_by("step").values_list("tokens", flat=True)) == [100, 200, 300, 400, 500]
    running_run.refresh_from_db()
    assert (running_run.current_step, running_run.tokens_seen, running_run.train_seconds) == (5, 500, 2.5)
    assert running_run.final_metrics["loss"] == {"last": 2.0, "min": 2.0, "max": 10.0, "step": 5}


def test_the_runs_table_sort_menu_offers_each_metric_once_the_worker_writes_it(running_run):
    """The reporter adds the names it writes to the project's (``ProjectMetricName``) with the points, while the run
    trains: a metric first logged at a later step (an evaluation's) is offered from then on; one only ever logged
    NaN, which ``final_metrics`` leaves out, is not."""
    report(running_run, [record(1, bad=math.nan), record(2, **{"eval/loss": 1.5})])
    assert selectors.project_metric_names(project=running_run.project) == sorted(
        Run.objects.get(pk=running_run.pk).final_metrics) == ["epoch", "eval/loss", "learning_rate", "loss", "tokens"]


def test_a_metric_a_restarted_attempt_no_longer_logs_leaves_the_sort_menu_unless_another_run_holds_it(running_run):
    """An attempt that starts over (no checkpoint was saved) drops the steps an earlier attempt logged, and with them
    the metrics only those steps held: the run's ``final_metrics`` loses them as the new attempt begins, and the sort
    menu, which offered them, stops offering the ones no other run of the project holds (sorting by one ordered
    nothing), while the attempt trains and once it ends."""
    other = services.run_create(project=running_run.project, spec=running_run.spec, user=None, name="other")
    Run.objects.filter(pk=other.pk).update(final_metrics={"eval/bleu": {"last": 0.5, "min": 0.5, "max": 0.5, "step": 1}})
    report(running_run, [record(1), record(2, **{"eval/loss": 1.5, "eval/bleu": 0.25})])
    assert {"eval/bleu", "eval/loss"} <= set(selectors.project_metric_names(project=running_run.project))
    restarted = [record(1)]
    report(Run.objects.get(pk=running_run.pk), restarted)
    kept = ["epoch", "eval/bleu", "learning_rate", "loss", "tokens"]  # eval/bleu: the other run holds it
    assert sorted(Run.objects.get(pk=running_run.pk).final_metrics) == [name for name in kept if name != "eval/bleu"]
    assert selectors.project_metric_names(project=running_run.project) == kept
    reporting.run_finish(run=Run.objects.get(pk=running_run.pk), summary={"status": "succeeded", "step": 1})
    assert selectors.project_metric_names(project=running_run.project) == kept


def test_progress_events_carry_the_latest_tokens_per_second(running_run):
    """The run page's Tokens/s read '—' all through a run: no event carried it, so it changed on a reload only."""
    reporter = reporting.RunReporter(run=running_run, flush_seconds=0.05, use_redis=False)
    events = []
    reporter._publish = events.append
    reporter.start()
    for step in range(1, 4):
        reporter.on_progress(record(step, tokens_per_second=1000.0 * step))
    reporter.close()
    progress = [event for event in events if event["type"] == "progress"]
    assert progress and progress[-1]["tokens_per_second"] == 3000.0


def test_replaying_a_step_never_duplicates_it(running_run):
    report(running_run, [record(1), record(2), record(2)])
    assert MetricPoint.objects.filter(run=running_run, name="loss").count() == 2


# Where a resumed attempt's token count starts: the engine goes on with the whole run's count, an
# older engine (whose run directories and attempts still exist) counted from 0 again.
RESUMED_COUNTS = pytest.mark.parametrize("counted_from", ["run_start", "resume"])


@RESUMED_COUNTS
def test_a_resumed_attempt_replaces_later_steps_and_continues_tokens(running_run, counted_from):
    report(running_run, [record(step) for step in range(1, 8)])  # died after step 7, checkpoint at 4
    resumed = [record(step, offset_steps=4 if counted_from == "resume" else 0) for step in range(5, 11)]
    resumed = [Progress(item.step, item.total_steps, {**item.metrics, "loss": 1.0}, item.elapsed_seconds, item.tokens_seen)
               for item in resumed]
    report(Run.objects.get(pk=running_run.pk), resumed)
    losses = dict(MetricPoint.objects.filter(run=running_run, name="loss").values_list("step", "value"))
    assert sorted(losses) == list(range(1, 11))
    assert losses[4] == 2.5 and losses[5] == 1.0 and losses[7] == 1.0  # steps 5-7 are the new attempt's
    tokens = dict(MetricPoint.objects.filter(run=running_run, name="tokens").values_list("step", "value"))
    assert tokens[4] == 400 and tokens[5] == 500 and tokens[10] == 1000
    assert running_run.log_lines.filter(message="resumed: continuing from step 4").exists()


def test_a_resumed_attempts_latest_and_range_leave_out_the_steps_it_trains_again(running_run):
    """QA: a run lost at step 7 and resumed from its checkpoint at step 4 kept, until it passed step 7, the
    old step 7's loss as its latest (the table, the compare page and Tokens/s read it) and the range of
    points since deleted."""
    report(running_run, [record(step) for step in range(1, 8)])  # loss 10 / step; lost after step 7
    resumed = [Progress(step, 10, {**record(step).metrics, "loss": 3.0, "tokens_per_second": 50.0}, step * 0.5,
                        step * 100) for step in (5, 6)]
    report(Run.objects.get(pk=running_run.pk), resumed)
    run = Run.objects.get(pk=running_run.pk)
    assert run.final_metrics["loss"] == {"last": 3.0, "min": 2.5, "max": 10.0, "step": 6}
    assert run.final_metrics["tokens_per_second"]["last"] == 50.0


def test_a_value_not_finite_is_kept_as_the_metrics_latest_until_a_finite_one_follows(running_run):
    """NaN and infinity are not stored as points; the step and value of each metric's latest one are, so
    that a reader of ``final_metrics`` (a pipeline guard) can tell its "last" is older than what was logged."""
    from webapp.runs import selectors

    report(running_run, [record(1, **{"eval/loss": 2.0}), record(2), record(3, **{"eval/loss": math.nan}),
                         record(4, grad_norm=-math.inf)])
    run = Run.objects.get(pk=running_run.pk)
    assert run.final_metrics["eval/loss"]["last"] == 2.0
    assert run.not_finite_metrics == {"eval/loss": {"step": 3, "value": "nan"},
                                      "grad_norm": {"step": 4, "value": "-inf"}}
    assert selectors.latest_not_finite(run=run, name="eval/loss") == ("NaN", 3)
    assert selectors.latest_not_finite(run=run, name="grad_norm") == ("minus infinity", 4)
    assert selectors.latest_not_finite(run=run, name="loss") is None
    # Resumed from the checkpoint at step 2: the steps after it are computed again, finite this time.
    report(run, [record(3, **{"eval/loss": 1.5}), record(4, grad_norm=0.5)])
    run = Run.objects.get(pk=running_run.pk)
    assert run.not_finite_metrics == {} and selectors.latest_not_finite(run=run, name="eval/loss") is None
    report(run, [record(5, **{"eval/loss": math.inf}), record(6, **{"eval/loss": 1.4})])
    run = Run.objects.get(pk=running_run.pk)
    assert run.not_finite_metrics == {"eval/loss": {"step": 5, "value": "inf"}}
    assert selectors.latest_not_finite(run=run, name="eval/loss") is None, "a finite value came after"


@RESUMED_COUNTS
def test_steps_lost_with_a_killed_worker_are_recovered_from_the_run_directory(running_run, counted_from):
    # The killed attempt's database writes stopped at step 5, but it reached step 8 with a checkpoint
    # at 7: metrics.jsonl (written by the engine before each checkpoint) holds steps 1-7.
    report(running_run, [record(step) for step in range(1, 6)])
    running_run.output_dir.mkdir(parents=True, exist_ok=True)
    lines = [record(step).metrics for step in range(1, 8)]
    (running_run.output_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    resumed = [record(step, offset_steps=7 if counted_from == "resume" else 0) for step in range(8, 11)]
    report(Run.objects.get(pk=running_run.pk), resumed)
    losses = dict(MetricPoint.objects.filter(run=running_run, name="loss").values_list("step", "value"))
    assert sorted(losses) == list(range(1, 11))
    assert losses[6] == pytest.approx(10.0 / 6) and losses[7] == pytest.approx(10.0 / 7)
    tokens = dict(MetricPoint.objects.filter(run=running_run, name="tokens").values_list("step", "value"))
    assert [tokens[step] for step in range(5, 11)] == [500, 600, 700, 800, 900, 1000]
    assert running_run.log_lines.filter(message="recovered steps 6-7 from the run directory").exists()


def test_an_older_engines_restarted_count_that_the_engine_goes_on_with_is_offset_once(running_run):
    # An older engine ran steps 1-4 and, resumed after step 2, steps 3-6 counting from 0 again; the
    # engine then resumed that run's checkpoint at 6, which holds no count, and goes on from the one
    # metrics.jsonl logged there (400), not from the run's 600.
    report(running_run, [record(step) for step in range(1, 5)])
    report(Run.objects.get(pk=running_run.pk), [record(step, offset_steps=2) for step in range(3, 7)])
    lines = [record(step).metrics for step in (1, 2)] + [record(step, offset_steps=2).metrics for step in range(3, 7)]
    running_run.output_dir.mkdir(parents=True, exist_ok=True)
    (running_run.output_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    report(Run.objects.get(pk=running_run.pk), [record(step, offset_steps=2) for step in (7, 8)])
    tokens = dict(MetricPoint.objects.filter(run=running_run, name="tokens").values_list("step", "value"))
    assert [tokens[step] for step in range(1, 9)] == [100, 200, 300, 400, 500, 600, 700, 800]
    assert Run.objects.get(pk=running_run.pk).tokens_seen == 800


def write_token_lines(path, counts: list[int]) -> None:
    path.write_text("".join(json.dumps({"step": step, "tokens": count}) + "\n"
                            for step, count in enumerate(counts, start=1)))


def test_token_counts_read_back_from_the_engine_are_the_runs(tmp_path):
    # Resumed after step 2, the engine went on with the count: lines never go down.
    write_token_lines(tmp_path / "metrics.jsonl", [100, 200, 300, 400])
    records, count = reporting.read_metric_lines(tmp_path / "metrics.jsonl", before_step=4)
    assert [(r["step"], r["tokens"]) for r in records] == [(1, 100), (2, 200), (3, 300)]
    assert (count.total, count.engine_count) == (300, 300)


def test_token_counts_read_back_from_an_older_engine_are_made_cumulative_across_attempts(tmp_path):
    # Attempt 1: steps 1-3 (tokens 100..300); attempt 2 resumed after step 2, counting from 0 again;
    # attempt 3, by the engine, resumed attempt 2's checkpoint at 4 and went on with its count.
    write_token_lines(tmp_path / "metrics.jsonl", [100, 200, 100, 200, 300])
    records, count = reporting.read_metric_lines(tmp_path / "metrics.jsonl", before_step=6)
    assert [(r["step"], r["tokens"]) for r in records] == [(1, 100), (2, 200), (3, 300), (4, 400), (5, 500)]
    assert (count.total, count.engine_count) == (500, 300)


def test_samples_of_an_evaluated_step_are_stored(running_run):
    running_run.output_dir.mkdir(parents=True, exist_ok=True)
    lines = [{"step": 2, "prompt": "a", "text": "x"}, {"step": 4, "prompt": "b", "text": "<y>", "answer": "y"},
             {"step": 4, "prompt": [{"role": "user", "content": "c"}], "text": "z", "rewards": {"format": 1.0, "exact": 0.5}}]
    (running_run.output_dir / "samples.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    report(running_run, [record(3), record(4, **{"eval/loss": 1.5, "eval/exact_match/add": 0.25})])
    samples = list(Sample.objects.filter(run=running_run).order_by("step", "position"))
    assert [(s.step, s.position, s.text) for s in samples] == [(2, 0, "x"), (4, 0, "<y>"), (4, 1, "z")]
    samples = samples[1:]
    assert samples[0].answer == "y" and samples[1].rewards == {"format": 1.0, "exact": 0.5} and samples[1].reward == 1.5
    # A group's figure is charted (stored as a metric) but not spelled out in the log line.
    assert running_run.log_lines.filter(message="step 4: evaluated (eval/loss 1.5; 2 samples)").exists()
    assert MetricPoint.objects.get(run=running_run, name="eval/exact_match/add").value == 0.25


def test_the_evaluated_line_names_eval_values_that_are_not_finite(running_run):
    """An eval loss gone NaN (or a metric gone infinite) was left out of the line, as if never evaluated."""
    report(running_run, [record(2, **{"eval/loss": math.nan, "eval/accuracy": 0.5, "eval/reward": -math.inf,
                                      "eval/kl": math.inf})])
    assert running_run.log_lines.filter(
        message="step 2: evaluated (eval/loss nan, eval/accuracy 0.5, eval/reward -inf, eval/kl inf)").exists()


def test_the_database_cancel_flag_stops_the_run(running_run):
    Run.objects.filter(pk=running_run.pk).update(cancel_requested=True)
    reporter = reporting.RunReporter(run=running_run, flush_seconds=0.05, heartbeat_seconds=0.05, use_redis=False)
    reporter.start()
    try:
        assert _eventually(reporter.should_stop)
    finally:
        reporter.close()


def test_a_superseded_attempt_stops_and_records_nothing(running_run):
    Run.objects.filter(pk=running_run.pk).update(status=RunStatus.QUEUED, attempt=2)
    reporter = reporting.RunReporter(run=running_run, flush_seconds=0.05, heartbeat_seconds=0.05, use_redis=False)
    reporter.start()
    try:
        assert _eventually(reporter.should_stop)
    finally:
        reporter.close()
    reporting.run_finish(run=running_run, summary={"status": "succeeded", "step": 10})
    assert Run.objects.get(pk=running_run.pk).status == RunStatus.QUEUED


def test_finish_records_status_and_artifacts(running_run, tmp_path):
    (tmp_path / "export" / "adapter").mkdir(parents=True)
    (tmp_path / "export" / "config.json").write_text("{}")
    (tmp_path / "export" / "adapter" / "adapter_model.safetensors").write_bytes(b"lora")
    report(running_run, [record(1), record(2)])
    export = {"model": str(tmp_path / "export"), "adapter": str(tmp_path / "export" / "adapter")}
    run = reporting.run_finish(run=running_run, summary={"status": "cancelled", "message": "cancelled at step 2",
                                                          "step": 2, "export": export})
    assert run.status == RunStatus.CANCELLED and run.error_message == "cancelled at step 2" and run.finished_at
    # Each the size of its download: the merged model's counted its adapter, which downloads on its own.
    assert run.artifacts.get(kind=ArtifactKind.MODEL).size_bytes == 2
    assert run.artifacts.get(kind=ArtifactKind.ADAPTER).size_bytes == 4
    assert run.final_metrics["loss"]["last"] == 5.0
    # The log said it twice: 'cancelled at step 2: cancelled at step 2'.
    assert run.log_lines.order_by("-id").first().message == "cancelled at step 2"


def test_a_runs_export_is_recorded_with_the_step_it_holds_and_once(running_run, tmp_path):
    """A resumed run's earlier export was listed with no step; the engine writes each export over the last."""
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text("{}")
    export = {"model": str(tmp_path / "export")}
    reporting.run_finish(run=running_run, summary={"status": "succeeded", "step": 40, "export": export})
    assert [(a.kind, a.step) for a in running_run.artifacts.all()] == [(ArtifactKind.MODEL, 40)]
    Run.objects.filter(pk=running_run.pk).update(status=RunStatus.RUNNING, attempt=2, total_steps=80)
    resumed = Run.objects.get(pk=running_run.pk)
    reporting.run_finish(run=resumed, summary={"status": "succeeded", "step": 80, "export": export})
    assert [(a.kind, a.step) for a in resumed.artifacts.all()] == [(ArtifactKind.MODEL, 80)]


def test_a_finished_runs_log_line_carries_the_engines_message(running_run):
    report(running_run, [record(1), record(2)])
    run = reporting.run_finish(run=running_run, summary={"status": "failed", "step": 2,
                                                          "message": "stopped by the guard at step 2: kl 0.9 > 0.5"})
    assert run.log_lines.order_by("-id").first().message == "failed at step 2: stopped by the guard at step 2: kl 0.9 > 0.5"


CUT = ("data.train: 10838 of 10838 rows (100%) were longer than data.max_seq_len 512 tokens and were cut to it: raise "
       "data.max_seq_len, or shorten those rows")
LEFT_OUT = ("data.train: 3 of 10838 rows were left out, with no token to train on (an empty completion, or no assistant "
            "turn): fill or remove them")


def warnings_of(run) -> list[str]:
    return list(run.log_lines.filter(level=LogLevel.WARNING).order_by("id").values_list("message", flat=True))


def test_what_the_data_lost_to_max_seq_len_is_logged_while_the_run_runs_and_once(running_run):
    """QA: an SFT at data.max_seq_len 8 cut every one of its 10,838 rows, and its log said so when the run ended (from
    its summary's data): the engine says it through ``on_log`` once its data is encoded, before the first step, and
    the run's log has it as a warning while the run runs. A resumed attempt, which encodes the data again and says it
    again, and the run's end, whose summary holds the same counts, do not log it twice."""
    reporter = reporting.RunReporter(run=running_run, flush_seconds=0.05, use_redis=False)
    reporter.start()
    for line in (RunLogWarning(CUT), RunLogWarning(LEFT_OUT)):
        reporter.log_engine_line(line)
    reporter.on_progress(record(1))
    assert Run.objects.get(pk=running_run.pk).status == RunStatus.RUNNING
    assert warnings_of(running_run) == [CUT, LEFT_OUT]
    reporter.close()
    resumed = reporting.RunReporter(run=Run.objects.get(pk=running_run.pk), flush_seconds=0.05, use_redis=False)
    resumed.start()
    for line in (RunLogWarning(CUT), RunLogWarning(LEFT_OUT)):
        resumed.log_engine_line(line)
    resumed.on_progress(record(2))
    resumed.close()
    data = {"train": {"rows": 10838, "examples": 10838, "truncated": 10838, "dropped": 3, "split": 0}}
    run = reporting.run_finish(run=Run.objects.get(pk=running_run.pk),
                               summary={"status": "succeeded", "step": 2, "data": data})
    assert warnings_of(run) == [CUT, LEFT_OUT]
    assert run.log_lines.order_by("-id").first().message == "succeeded at step 2"
    # The engine's other lines are information, said as often as the engine says them.
    reporter = reporting.RunReporter(run=run, flush_seconds=0.05, use_redis=False)
    reporter.log_engine_line("resumed from step 2 with a changed setting: train.max_steps 2 -> 3")
    assert run.log_lines.filter(level=LogLevel.INFO, message__startswith="resumed from step 2").count() == 1


def test_the_split_by_turn_note_is_logged_once_in_a_run_of_several_attempts(running_run):
    """A chat dataset's conversations trained one assistant turn per example were said again at each attempt (a
    resume after a worker loss said it twice): the note (``RunLogOnce``, not a warning) is logged once, as
    information, however many attempts say it; the engine's other lines are logged each time."""
    from jaxengine.data.pipeline import split_by_turn_note
    from jaxengine.job import RunLogOnce

    note = RunLogOnce(split_by_turn_note({"rows": 4, "examples": 12, "split_by_turn": 4}, use="train"))
    for attempt in (1, 2):
        reporter = reporting.RunReporter(run=Run.objects.get(pk=running_run.pk), flush_seconds=0.05, use_redis=False)
        reporter.log_engine_line(note)
        reporter.log_engine_line("resumed from step 2 with a changed setting: train.max_steps 2 -> 3")
    lines = running_run.log_lines.order_by("id")
    assert list(lines.filter(message=note).values_list("level", flat=True)) == [LogLevel.INFO]
    assert lines.filter(message__startswith="resumed from step 2").count() == 2
    assert warnings_of(running_run) == []


def test_an_engine_error_fails_the_run(running_run):
    run = reporting.run_fail(run=running_run, error=ValueError("data.train: no usable rows"))
    assert run.status == RunStatus.FAILED and run.error_message == "ValueError: data.train: no usable rows"


def _eventually(condition, timeout: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_it_stores_the_runs_buckets_with_the_points(running_run):
    from webapp.runs import selectors

    report(running_run, [record(step) for step in range(1, 8)])  # died after step 7
    running_run.refresh_from_db()
    stored = running_run.series_cache["buckets"]
    assert stored == selectors.series_buckets(run=running_run, reuse_stored=False).to_json()
    # [index, first step, last step, low, high, tokens, wall time, the low's step, the high's step, the
    #  low's tokens and wall time, the high's tokens and wall time]
    wall_time = stored["buckets"]["loss"][0][6]
    assert stored["through_step"] == 7 and stored["buckets"]["loss"][0] == [0, 1, 1, 10.0, 10.0, 100, wall_time,
                                                                           1, 1, 100, wall_time, 100, wall_time]
    # A resumed attempt from step 5 replaces steps 5-7: the stored buckets are rebuilt without them.
    resumed = [Progress(item.step, item.total_steps, {**item.metrics, "loss": 100.0}, item.elapsed_seconds,
                        item.tokens_seen) for item in (record(step, offset_steps=4) for step in (5, 6))]
    report(Run.objects.get(pk=running_run.pk), resumed)
    running_run.refresh_from_db()
    losses = {row[1]: row[3] for row in running_run.series_cache["buckets"]["buckets"]["loss"]}
    assert running_run.series_cache["buckets"]["through_step"] == 6
    assert losses == {1: 10.0, 2: 5.0, 3: 10 / 3, 4: 2.5, 5: 100.0, 6: 100.0}


def rollout(step: int, index: int, **extra) -> dict:
    return {"step": step, "kind": "rollout", "prompt": f"p{index // 2}", "text": f"completion {step}.{index}",
            "rewards": {"exact_match": float(index % 2), "format_regex": 0.5}, "reward": index % 2 + 0.25,
            "advantage": 1.0 if index % 2 else -1.0, "finish_reason": "stop", **extra}


def test_every_steps_rollouts_are_stored_as_they_are_written_within_bounds(running_run, monkeypatch):
    monkeypatch.setattr(reporting, "ROLLOUTS_PER_STEP", 3)
    monkeypatch.setattr(reporting, "SAMPLE_TEXT_CHARS", 16)
    running_run.output_dir.mkdir(parents=True, exist_ok=True)
    path = running_run.output_dir / "samples.jsonl"
    # Step 1's four rollouts, and half a line of step 2's being written.
    path.write_text("".join(json.dumps(rollout(1, index)) + "\n" for index in range(4)) + '{"step": 2, "ki')
    reporter = reporting.RunReporter(run=running_run, flush_seconds=0.05, use_redis=False)
    reporter.start()
    reporter.on_progress(record(1))
    import time
    deadline = time.monotonic() + 10
    while not Sample.objects.filter(run=running_run).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    with path.open("w") as handle:  # the line completed, then the next step's rollouts
        handle.write("".join(json.dumps(rollout(1, index)) + "\n" for index in range(4)))
        handle.write("".join(json.dumps(rollout(2, index, text="a" * 20 if index == 0 else "b")) + "\n"
                             for index in range(2)))
        handle.write(json.dumps({"step": 2, "kind": "eval", "prompt": "q", "text": "greedy", "reward": 1.0}) + "\n")
    reporter.on_progress(record(2, **{"eval/reward": 1.0}))
    reporter.close()
    stored = {(s.step, s.position): s for s in Sample.objects.filter(run=running_run)}
    # At most 3 rollouts of step 1 (the first ones); step 2's two rollouts and its eval generation.
    assert sorted(stored) == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    first = stored[(1, 1)]
    assert first.rewards == {"exact_match": 1.0, "format_regex": 0.5} and first.reward == 1.25
    assert first.extra == {"kind": "rollout", "advantage": 1.0, "finish_reason": "stop"}
    long = stored[(2, 0)]
    assert long.text == "a" * 16 and long.extra["truncated_from"] == 20
    assert stored[(2, 2)].extra == {"kind": "eval"}
    assert running_run.log_lines.filter(message="step 2: evaluated (eval/reward 1; 1 sample)").exists()


def test_a_failure_names_the_runs_files_as_the_project_names_them(running_run):
    """A GRPO run whose reward read a column its data lacked failed naming the dataset's file under the data
    root ("row 3 of /srv/temper/datasets/ds_…/v1/data.jsonl"), a path nobody in the project chose."""
    version = running_run.dataset_versions.get()
    model_path = running_run.resolved_spec["model"]
    failed = reporting.run_fail(run=running_run, error=RuntimeError(
        f"exact_match: row 3 of {version.absolute_path} has no 'answer' column; tokenizer of {model_path} ok"))
    name = running_run.base_model.name
    assert failed.error_message == (f"RuntimeError: exact_match: row 3 of {version} has no 'answer' column; "
                                    f"tokenizer of base model {name} ok")
    assert str(version.absolute_path) not in failed.log_lines.last().message


def test_a_resume_refused_for_changed_training_data_names_the_checkpoints_launch_action(running_run):
    """A resume under another data.columns is refused by the engine (``refuse_changed_training_data``), whose way on
    said "export checkpoint 400 (on the run's page, or jaxengine export --run <the server's run directory> --step
    400) and launch a run from the exported model": three steps on the page, and a command for a shell a user of the
    web does not have. The run's message names the checkpoint's Launch a run from it, which does them, and no
    command or server path."""
    from jaxengine.job import JobError, changed_training_data_problem
    from jaxengine.spec import parse_spec

    spec = parse_spec({**running_run.resolved_spec, "data": {**running_run.resolved_spec["data"],
                                                            "columns": {"completion": "answer"}}})
    problem = changed_training_data_problem({"data": {"columns": {}}}, spec, run_dir=running_run.output_dir, step=400)
    assert "jaxengine export" in problem  # the engine's own says both ways, for its command line
    failed = reporting.run_fail(run=running_run, error=JobError(problem))
    assert failed.error_message.endswith(
        "as a new run from checkpoint 400: its Launch a run from it, under Checkpoints on the run's page, exports it "
        "first and opens the launch form with it")
    assert "jaxengine" not in failed.error_message and str(running_run.output_dir) not in failed.error_message


def test_an_engine_summary_of_failure_names_the_runs_files_as_the_project_names_them(running_run):
    version = running_run.dataset_versions.get()
    finished = reporting.run_finish(run=running_run, summary={
        "status": "failed", "step": 0, "message": f"data.train: {version.absolute_path} has no usable rows"})
    assert finished.error_message == f"data.train: {version} has no usable rows"


def test_a_failure_names_the_starting_runs_model_as_that_run_not_as_the_base_model_of_the_chain(running_run,
                                                                                                tmp_path):
    """A run started from another run's export records both that run and the base model at the root of the
    chain: the export's directory was named "base model demo-base" (where a user found nothing wrong)."""
    Run.objects.filter(pk=running_run.pk).update(status=RunStatus.SUCCEEDED)
    export = tmp_path / "export"
    export.mkdir()
    Artifact.objects.create(run=running_run, kind=ArtifactKind.MODEL, path=str(export))
    spec = {**running_run.spec, "model": running_run.public_id}
    child = services.run_create(project=running_run.project, spec=spec, user=None, name="child")
    child = reporting.run_start(run_pk=child.pk, attempt=1, worker_name="train@test")
    assert child.base_model == running_run.base_model and child.source_run == running_run
    failed = reporting.run_fail(run=child, error=FileNotFoundError(f"{export}/config.json: no such file"))
    assert failed.error_message == (f"FileNotFoundError: the model of run {running_run.name} "
                                    f"({running_run.public_id})/config.json: no such file")


def test_an_evaluation_in_progress_is_published_for_the_run_page(running_run):
    """QA: the run page gave no sign of a minute-long evaluation. The engine's ``on_evaluation`` is published
    as an ``evaluating`` event, the latest of each flush (the training thread only keeps it)."""
    reporter = reporting.RunReporter(run=running_run, flush_seconds=0.05, use_redis=False)
    events = []
    reporter._publish = events.append
    reporter.start()
    reporter.on_progress(record(1))
    reporter.on_evaluation(EvalProgress(step=2, batches_done=3, batches=8))
    reporter.close()
    assert [event for event in events if event["type"] == "evaluating"] == [
        {"type": "evaluating", "step": 2, "batches_done": 3, "batches": 8, "generating": False}]


def test_a_page_loaded_mid_evaluation_says_it_is_evaluating(running_run, redis_server, settings, client):
    """QA: "evaluating step N (n/m batches)" came only over the live stream, so a run page opened during a
    long evaluation showed nothing until the next event. The writer keeps the latest evaluation in Redis
    beside publishing it, and the page shows it on load until that step's progress is recorded."""
    settings.REDIS_URL = redis_server.url
    reporter = reporting.RunReporter(run=running_run, flush_seconds=0.05, use_redis=True)
    reporter.start()
    reporter.on_progress(record(1))
    reporter.on_evaluation(EvalProgress(step=2, batches_done=3, batches=8))
    reporter.close()
    client.force_login(running_run.created_by)
    page_url = f"/p/{running_run.project.slug}/runs/{running_run.public_id}/"
    page = client.get(page_url).content.decode()
    assert '<span class="muted" id="progress-evaluating" data-step="2">evaluating step 2 (3/8 batches)</span>' in page
    # Once step 2 is recorded the evaluation is over: nothing said on load.
    report(running_run, [record(2)])
    page = client.get(page_url).content.decode()
    assert '<span class="muted" id="progress-evaluating" hidden></span>' in page


def test_the_run_page_of_an_active_run_renders_without_redis(running_run, settings, client):
    """The run page asks Redis for the evaluation under way on every load of an active run's page; with Redis
    away (nothing listens on its port) the page still renders, saying nothing of an evaluation."""
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    report(running_run, [record(1)])
    client.force_login(running_run.created_by)
    response = client.get(f"/p/{running_run.project.slug}/runs/{running_run.public_id}/")
    assert response.status_code == 200
    assert '<span class="muted" id="progress-evaluating" hidden></span>' in response.content.decode()


def test_an_engine_line_goes_into_the_log_in_the_projects_names_and_shows_on_the_run_page(running_run, client):
    """Issue 8: the engine's lines for the run's log (``on_log``: a resume's changed settings) are stored as log
    lines naming a dataset version's file as the version, not a path under the data root, and the run page shows
    them, escaped."""
    from django.utils.html import escape

    version = running_run.dataset_versions.get()
    reporter = reporting.RunReporter(run=running_run, use_redis=False)
    reporter.log_engine_line(f"resumed from step 3 with a changed setting: data.eval {version.absolute_path} changed "
                             "since that step (sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb): eval scores from here on are over "
                             "other rows")
    expected = (f"resumed from step 3 with a changed setting: data.eval {version} changed since that step (sha256 "
                "aaaaaaaaaaaa -> bbbbbbbbbbbb): eval scores from here on are over other rows")
    assert running_run.log_lines.order_by("pk").last().message == expected
    client.force_login(running_run.created_by)
    page = client.get(f"/p/{running_run.project.slug}/runs/{running_run.public_id}/").content.decode()
    log = page[page.index('<ol class="log" id="log">'):]
    assert f"</time> {escape(expected)}</li>" in log[:log.index("</ol>")]


def test_an_attempts_elapsed_time_counts_from_its_start(running_run):
    """The run page counts Elapsed from the attempt's start while it loads the model and compiles, after the earlier
    attempts' time; at the first step it took the engine's clock, which starts after the load, and Elapsed stepped
    back by that. The attempt's seconds are counted from its start, at least the engine's."""
    from datetime import timedelta

    from django.utils import timezone

    Run.objects.filter(pk=running_run.pk).update(train_seconds=100.0,
                                                 started_at=timezone.now() - timedelta(seconds=20))
    running_run.refresh_from_db()
    report(running_run, [record(1)])  # the engine's clock: 0.5 s
    running_run.refresh_from_db()
    assert 120.0 <= running_run.train_seconds < 130.0
