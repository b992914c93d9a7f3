"""Runs on a real train worker over a real Redis: a tiny SFT run trains end to end; a cancel
stops it within seconds of a step and a resume continues its history; a train worker killed with
SIGKILL mid-run is detected by its silent heartbeat and the run resumes from its last checkpoint on
a new worker, and a prefork pool process killed mid-run is re-queued by its own worker at once (and, killed
again and again before a new checkpoint, fails its run with the reason); a Redis
restart mid-run loses neither the run nor a metric point.

The train worker runs with short timings (heartbeats 1 s, lost after 6 s, reaper every 2 s) so that
the fault tests take seconds instead of minutes; the logic is the same as with the defaults.
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
import redis
from django.test import Client
from django.utils.html import escape

from tests.factories import build_tiny_model_dir
from tests.live import environment, wait_for
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.runs import pipelines, services
from webapp.runs.models import ArtifactKind, LogLevel, MetricPoint, PipelineStatus, Run, RunStatus
from webapp.workers.deliveries import unacked_deliveries
from webapp.workers.models import Worker

pytestmark = pytest.mark.integration

FAST_TIMINGS = {"TEMPER_RUN_HEARTBEAT_SECONDS": "1", "TEMPER_RUN_LOST_SECONDS": "6", "TEMPER_REAPER_SECONDS": "2",
                "TEMPER_HEARTBEAT_SECONDS": "1"}
ROWS = [{"prompt": f"question {i}: what is {i} plus {i}?", "completion": f"it is {2 * i}"} for i in range(24)]


@pytest.fixture(scope="module")
def fast_timings():
    with environment(FAST_TIMINGS):
        yield


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from django.conf import settings

    return build_tiny_model_dir(settings.MODELS_ROOT / "tiny-runs")


@pytest.fixture
def train_worker(fast_timings, celery_workers, transactional_db, settings, redis_url):
    settings.REDIS_URL = redis_url  # the web side's cancel flags and live events go to the test Redis
    celery_workers.ensure("train")
    return celery_workers


@pytest.fixture
def setup(train_worker, tiny_model_dir):
    team = make_team()
    base_model = make_base_model(team.project, path=str(tiny_model_dir))
    data = make_ready_version(team.project, rows=ROWS)
    return team, base_model, data


def launch(setup, **train) -> Run:
    team, base_model, data = setup
    spec = {"task": "sft", "model": base_model.public_id,
            "data": {"train": data.public_id, "eval": data.public_id, "max_seq_len": 48},
            "train": {"batch_size": 4, "eval_samples": 2, "sample_max_new_tokens": 4, **train}}
    return services.run_create(project=team.project, spec=spec, user=team.teammate)


def reached(run: Run, *, status=None, step=None):
    def check():
        run.refresh_from_db()
        if status is not None and run.status != status:
            return False
        return step is None or run.current_step >= step
    return check


def loss_steps(run: Run) -> list[int]:
    return list(MetricPoint.objects.filter(run=run, name="loss").order_by("step").values_list("step", flat=True))


def test_a_tiny_sft_run_trains_on_the_worker(setup, train_worker):
    run = launch(setup, max_steps=12, eval_every=6, save_every=6)
    wait_for(reached(run, status=RunStatus.SUCCEEDED), timeout=120, workers=train_worker, what="the run to succeed")
    assert run.current_step == 12 and run.total_steps == 12 and run.tokens_seen > 0
    assert loss_steps(run) == list(range(1, 13))
    assert MetricPoint.objects.filter(run=run, name="eval/loss").count() == 2
    assert sorted(set(run.samples.values_list("step", flat=True))) == [6, 12]
    assert run.samples.filter(step=12).count() == 2
    assert run.final_metrics["loss"]["step"] == 12 and run.summary["status"] == "succeeded"
    exported = run.artifacts.get(kind=ArtifactKind.MODEL)
    assert (run.output_dir / "export" / "config.json").is_file() and exported.size_bytes > 0
    messages = list(run.log_lines.values_list("message", flat=True))
    assert any("attempt 1 started" in message for message in messages) and "succeeded at step 12" in messages[-1]

    # Checkpoint 6 becomes a starting model of its own.
    services.checkpoint_export_request(run=run, step=6, user=None)
    wait_for(lambda: run.artifacts.filter(kind=ArtifactKind.CHECKPOINT, step=6).exists(), timeout=120,
             workers=train_worker, what="the checkpoint export")
    exported = run.artifacts.get(kind=ArtifactKind.CHECKPOINT, step=6)
    assert (run.output_dir / "export-step-6" / "config.json").is_file() and exported.size_bytes > 0
    assert run.checkpoint_exports.get(step=6).status == "exported"  # what the run page shows
    team, _base_model, data = setup
    chained = services.run_create(project=team.project, user=None, spec={
        "task": "sft", "model": f"{run.public_id}@6", "data": {"train": data.public_id, "max_seq_len": 48},
        "train": {"max_steps": 1}})
    assert chained.resolved_spec["model"] == exported.path
    services.run_cancel(run=chained, user=None)  # checked, not trained: keep the worker free


def test_cancel_stops_within_seconds_and_resume_continues(setup, train_worker):
    run = launch(setup, max_steps=5000, save_every=1000)
    wait_for(reached(run, status=RunStatus.RUNNING, step=5), timeout=120, workers=train_worker, what="training")
    asked = time.monotonic()
    services.run_cancel(run=run, user=None)
    wait_for(reached(run, status=RunStatus.CANCELLED), timeout=10, workers=train_worker, what="the cancel")
    assert time.monotonic() - asked < 5
    stopped_at = run.current_step
    assert 5 <= stopped_at < 5000 and loss_steps(run) == list(range(1, stopped_at + 1))

    services.run_resume(run=run, user=None, max_steps=stopped_at + 8)
    wait_for(reached(run, status=RunStatus.SUCCEEDED), timeout=120, workers=train_worker, what="the resumed run")
    assert run.attempt == 2 and run.current_step == stopped_at + 8
    assert loss_steps(run) == list(range(1, stopped_at + 9))  # continuous, no step twice
    tokens = list(MetricPoint.objects.filter(run=run, name="tokens").order_by("step").values_list("value", flat=True))
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)  # the count continues across attempts
    # Issue 8: what the resume changed (here its new total) is in the run's log, and on its page.
    changed = f"resumed from step {stopped_at} with a changed setting: train.max_steps 5000 -> {stopped_at + 8}"
    assert changed in run.log_lines.values_list("message", flat=True)
    team, _base_model, _data = setup
    client = Client()
    client.force_login(team.teammate)
    page = client.get(f"/p/{team.project.slug}/runs/{run.public_id}/").content.decode()
    log = page[page.index('<ol class="log" id="log">'):]
    assert f"</time> {escape(changed)}</li>" in log[:log.index("</ol>")]  # the arrow as &gt;, shown as ->


def test_rows_cut_to_max_seq_len_are_in_the_log_while_the_run_runs_and_once_after_a_resume(setup, train_worker):
    """Said at the run's end only (from its summary), a run whose every row was cut told its user after its last step:
    the worker logs it, as a warning, once the engine has encoded the data; the resumed attempt encodes them again and
    the end's summary counts them again, and the log still says it once."""
    team, base_model, data = setup
    spec = {"task": "sft", "model": base_model.public_id, "data": {"train": data.public_id, "max_seq_len": 8},
            "train": {"batch_size": 4, "max_steps": 5000, "save_every": 1000}}
    run = services.run_create(project=team.project, spec=spec, user=team.teammate)
    cut = (f"data.train: {len(ROWS)} of {len(ROWS)} rows (100%) were longer than data.max_seq_len 8 tokens and were "
           "cut to it: raise data.max_seq_len, or shorten those rows")
    wait_for(reached(run, status=RunStatus.RUNNING, step=1), timeout=120, workers=train_worker, what="training")
    warnings = run.log_lines.filter(level=LogLevel.WARNING, message__startswith="data.")
    assert list(warnings.values_list("message", flat=True)) == [cut]
    services.run_cancel(run=run, user=None)
    wait_for(reached(run, status=RunStatus.CANCELLED), timeout=10, workers=train_worker, what="the cancel")
    services.run_resume(run=run, user=None, max_steps=run.current_step + 2)
    wait_for(reached(run, status=RunStatus.SUCCEEDED), timeout=120, workers=train_worker, what="the resumed run")
    assert run.attempt == 2 and run.summary["data"]["train"]["truncated"] == len(ROWS)
    assert run.log_lines.filter(message=cut).count() == 1


def test_a_killed_train_worker_is_detected_and_the_run_resumes(setup, train_worker, redis_url):
    run = launch(setup, max_steps=160, save_every=20)
    wait_for(reached(run, status=RunStatus.RUNNING, step=45), timeout=120, workers=train_worker, what="training")
    broker = redis.Redis.from_url(redis_url)

    def delivered_messages() -> list[str]:  # acks late: a run's message stays delivered while it trains
        return [delivery.tag for delivery in unacked_deliveries(broker) if delivery.arguments == f"[{run.pk}, 1]"]
    [delivered] = delivered_messages()
    # Within a heartbeat or two (every second here: `ensure` restarts a worker started with other timings).
    wait_for(lambda: Worker.objects.filter(name__startswith="test-train@", deliveries=[delivered]).exists(),
             timeout=25, workers=train_worker, what="the worker's heartbeat to report the message it holds")
    worker = train_worker.running["train"]
    worker.process.send_signal(signal.SIGKILL)
    worker.process.wait(timeout=10)
    # Where the engine was when it died: the database can lag it by a flush, so its last step may
    # be before a checkpoint the engine had just saved; the run directory's metrics.jsonl cannot.
    killed_at = max(json.loads(line)["step"] for line in (run.output_dir / "metrics.jsonl").read_text().splitlines()
                    if line.strip())
    train_worker.ensure("train")  # a new worker comes up; its reaper finds the silent run

    def requeued():
        run.refresh_from_db()
        return run.attempt == 2
    wait_for(requeued, timeout=30, workers=train_worker, what="the lost run to be re-queued")
    wait_for(reached(run, status=RunStatus.SUCCEEDED), timeout=150, workers=train_worker, what="the resumed run")
    assert loss_steps(run) == list(range(1, 161))
    messages = list(run.log_lines.values_list("message", flat=True))
    assert any("lost at step" in message for message in messages)
    assert any(message.startswith("resumed: continuing from step ") for message in messages)
    resumed_from = int(next(m for m in messages if m.startswith("resumed:")).rsplit(" ", 1)[1])
    assert resumed_from % 20 == 0 and resumed_from <= killed_at
    # The loss said so before the next attempt began: the worker, when, and the checkpoint it would resume from.
    [lost] = [message for message in messages if "lost at step" in message]
    assert lost.startswith("attempt 1 was lost at step ") and " on worker test-train@" in lost, lost
    assert ", last heard from at " in lost and lost.endswith(f"re-queued to resume from its checkpoint at step {resumed_from}")
    # The dead worker's message was queued again at once (not after Celery's hour-long visibility timeout)
    # and dropped as stale by the worker that took it (after attempt 2, or before it): Redis no longer holds it.
    dropped = "attempt 1: not queued as this attempt any more; message dropped"
    wait_for(lambda: dropped in train_worker.running["train"].log() and delivered_messages() == [], timeout=20,
             workers=train_worker, what="the lost worker's message to be queued again and dropped")


def test_a_killed_training_process_is_requeued_by_its_own_worker_at_once(setup, train_worker):
    """Production's train workers run each job in a prefork pool process. Killed -9 (or by the out-of-memory
    killer), it left its run "running" until the reapers found its heartbeat silent, TEMPER_RUN_LOST_SECONDS
    later (60-75 s with the defaults); its worker's main process sees the death at once and re-queues it."""
    from subprocess import run as run_command

    from tests.live import start_worker

    train_worker.stop_all()  # the solo train worker would take the run; this test's worker forks a process per job
    prefork = start_worker("train", redis_url=train_worker.redis_url, log_dir=train_worker.log_dir, name="test-prefork",
                           pool_args=("--pool", "prefork", "--concurrency", "1", "--max-tasks-per-child", "1"))
    try:
        run = launch(setup, max_steps=100000, save_every=20)
        wait_for(reached(run, status=RunStatus.RUNNING, step=25), timeout=120, workers=train_worker, what="training")
        [child] = run_command(["pgrep", "-P", str(prefork.process.pid)], capture_output=True, text=True).stdout.split()
        os.kill(int(child), signal.SIGKILL)

        def requeued():
            run.refresh_from_db()
            return run.attempt == 2
        wait_for(requeued, timeout=30, workers=train_worker, what="the lost run to be re-queued")
        # The worker's own settlement, not the reapers' (theirs says "silent for N s"): the reason, which the page
        # shows until the next attempt starts, stays in the log. Waited for: the settlement commits the next attempt,
        # then writes the line (not one transaction), and a check at once missed it once under load in CI.
        wait_for(lambda: run.log_lines.filter(message__contains="its training process died: Worker exited "
                                                                "prematurely: signal 9 (SIGKILL)").exists(),
                 timeout=30, workers=train_worker, what="the worker's own words for the lost attempt")
        wait_for(reached(run, status=RunStatus.RUNNING), timeout=120, workers=train_worker,
                 what="the next attempt, in the pool's new process")
        services.run_cancel(run=run, user=None)
        wait_for(reached(run, status=RunStatus.CANCELLED), timeout=60, workers=train_worker, what="the cancel")
    finally:
        prefork.stop()


def test_a_training_process_killed_again_and_again_fails_its_run_with_the_reason(setup, train_worker):
    """A run whose process is killed before each next checkpoint (out of memory at the same step, a batch that
    crashes it) was re-queued for ever; after TEMPER_RUN_LOST_LIMIT losses in a row it fails, saying why."""
    from subprocess import run as run_command

    from tests.live import start_worker

    train_worker.stop_all()  # the solo train worker would take the run; this test's worker forks a process per job
    prefork = start_worker("train", redis_url=train_worker.redis_url, log_dir=train_worker.log_dir,
                           name="test-prefork-lost", environment={"TEMPER_RUN_LOST_LIMIT": "2"},
                           pool_args=("--pool", "prefork", "--concurrency", "1", "--max-tasks-per-child", "1"))
    try:
        run = launch(setup, max_steps=100000, save_every=100000)
        for attempt in (1, 2):
            def training():
                run.refresh_from_db()
                return run.attempt == attempt and run.status == RunStatus.RUNNING and run.current_step >= 3
            wait_for(training, timeout=120, workers=train_worker, what=f"attempt {attempt} to train")
            [child] = run_command(["pgrep", "-P", str(prefork.process.pid)], capture_output=True, text=True).stdout.split()
            os.kill(int(child), signal.SIGKILL)
        wait_for(reached(run, status=RunStatus.FAILED), timeout=30, workers=train_worker, what="the run to fail")
        assert run.attempt == 2, run.error_message
        assert run.error_message.startswith("lost 2 times in a row at step "), run.error_message
        assert "before saving any checkpoint: the last time, attempt 2 on worker test-prefork-lost@" in run.error_message
        assert "signal 9 (SIGKILL)" in run.error_message and run.error_message.endswith("and Resume")
    finally:
        prefork.stop()


def test_a_redis_restart_loses_no_run_and_no_point(setup, train_worker, redis_server):
    run = launch(setup, max_steps=150, save_every=50)
    wait_for(reached(run, status=RunStatus.RUNNING, step=10), timeout=120, workers=train_worker, what="training")
    redis_server.restart(down_seconds=2)
    wait_for(reached(run, status=RunStatus.SUCCEEDED), timeout=150, workers=train_worker, what="the run to finish")
    assert run.attempt == 1
    assert loss_steps(run) == list(range(1, 151))
    names = set(MetricPoint.objects.filter(run=run, step=150).values_list("name", flat=True))
    assert {"loss", "grad_norm", "learning_rate", "tokens"} <= names


def test_a_queued_run_survives_a_redis_restart(setup, train_worker, redis_server):
    busy = launch(setup, max_steps=5000, save_every=1000)
    wait_for(reached(busy, status=RunStatus.RUNNING, step=3), timeout=120, workers=train_worker, what="training")
    waiting = launch(setup, max_steps=4)  # queued behind it: its message lives only in Redis
    redis_server.restart(down_seconds=1)  # no persistence: the queue is gone
    services.run_cancel(run=busy, user=None)
    wait_for(reached(waiting, status=RunStatus.SUCCEEDED), timeout=150, workers=train_worker,
             what="the queued run to be sent again and trained")
    assert waiting.attempt == 1 and loss_steps(waiting) == [1, 2, 3, 4]
    assert waiting.log_lines.filter(message__contains="queue message was lost").exists()


def test_a_pipeline_whose_export_message_redis_lost_is_failed_with_the_reason(setup, train_worker, redis_server):
    team, base_model, data = setup
    sft = {"task": "sft", "model": base_model.public_id, "data": {"train": data.public_id, "max_seq_len": 48},
           "train": {"max_steps": 2, "batch_size": 4}}
    pipeline = pipelines.pipeline_create(project=team.project, user=team.teammate, document={
        "name": "lost export", "stages": [{"name": "sft", "spec": sft}, {"name": "serve", "export": {"quantize": "int8"}}]})
    stage_run = pipeline.runs.get()
    # Queued behind the stage's run, so that the export message sent when that run ends waits behind
    # this one in Redis, where a restart without persistence loses it.
    busy = launch(setup, max_steps=5000, save_every=1000)
    wait_for(reached(busy, status=RunStatus.RUNNING, step=1), timeout=180, workers=train_worker,
             what="the stage's run to finish and the next run to start")
    pipeline.refresh_from_db()
    assert pipeline.current_stage == 1 and pipeline.status == PipelineStatus.RUNNING
    assert pipeline.result_run == stage_run
    redis_server.restart(down_seconds=1)

    def pipeline_failed():
        pipeline.refresh_from_db()
        return pipeline.status == PipelineStatus.FAILED

    wait_for(pipeline_failed, timeout=60, workers=train_worker, what="the reaper to fail the pipeline")
    assert pipeline.message.startswith("stage 2 (serve) lost: Redis no longer holds its export message ")
    assert pipeline.message.endswith(f"the result stays {stage_run.name} ({stage_run.public_id}), its unquantized export")
    assert not (stage_run.output_dir / "export" / "quantized").exists()
    services.run_cancel(run=busy, user=None)
    wait_for(reached(busy, status=RunStatus.CANCELLED), timeout=60, workers=train_worker, what="the cancel")


def test_a_ppo_run_scored_by_a_reward_run_of_the_project_trains_on_the_worker(setup, train_worker):
    team, base_model, _data = setup
    pairs = make_ready_version(team.project, name="pairs", kind="preference",
                               rows=[{"prompt": f"question {i}", "chosen": "yes", "rejected": "no"} for i in range(8)])
    prompts = make_ready_version(team.project, name="questions", kind="prompts",
                                 rows=[{"prompt": f"what is {i} plus {i}?", "answer": str(2 * i)} for i in range(8)])
    reward = services.run_create(project=team.project, user=team.teammate, spec={
        "task": "reward", "model": base_model.public_id, "data": {"train": pairs.public_id, "max_seq_len": 128},
        "train": {"max_steps": 2, "batch_size": 4}})
    wait_for(reached(reward, status=RunStatus.SUCCEEDED), timeout=180, workers=train_worker,
             what="the reward run to succeed")
    ppo = services.run_create(project=team.project, user=team.teammate, spec={
        "task": "ppo", "model": base_model.public_id,
        "data": {"train": prompts.public_id, "eval": prompts.public_id, "max_seq_len": 128},
        "train": {"max_steps": 3, "batch_size": 4, "eval_every": 3, "eval_samples": 2},
        "ppo": {"reward_model": reward.public_id, "max_new_tokens": 4, "kl_coef": 0.1}})
    assert ppo.resolved_spec["ppo"]["reward_model"] == reward.artifacts.get(kind=ArtifactKind.MODEL).path
    wait_for(reached(ppo, status=RunStatus.SUCCEEDED), timeout=240, workers=train_worker, what="the ppo run to succeed")
    assert loss_steps(ppo) == [1, 2, 3]
    for name in ("objective/kl", "rewards/reward_model/mean", "loss/value", "policy/clipfrac", "time/rollout"):
        assert MetricPoint.objects.filter(run=ppo, name=name).count() == 3, name
    assert MetricPoint.objects.filter(run=ppo, name="eval/reward_model").count() == 1
    rollouts = ppo.samples.exclude(rewards={})
    assert rollouts.count() >= 4 and all("reward_model" in sample.rewards for sample in rollouts)
    assert (ppo.output_dir / "export" / "config.json").is_file() and ppo.artifacts.filter(kind=ArtifactKind.MODEL)
