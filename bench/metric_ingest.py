"""Metric ingestion from a running job: points per second into the database, and what reporting
costs the training step.

Builds a throwaway SQLite database (production settings: WAL), a project and a run, and drives the
train worker's real reporter (``webapp.runs.reporting.RunReporter``, with a private redis-server
for its live publishing when one is installed) the way the engine does: one ``on_progress`` call
per step from the training thread.

1. ingest: ``--steps`` steps of ``--metrics`` metrics each, reported as fast as the loop can go;
   the rate is points stored per second, from the first report to the last row committed.
2. overhead: a stand-in training step run ``--trials`` times alternately with no reporting and
   with the reporter, at ``--overhead-metrics`` metrics per step. ``--step device`` (default) waits
   ``--step-ms`` with the GIL released, as the host thread does while an accelerator computes a
   jitted step: what reporting can then cost the step is the ``on_progress`` call and the wait to
   take the GIL back from the writer thread. ``--step matmul`` computes a float32 matmul instead
   (CPU training), which also competes with the writer for cores. Each trial's figure is its median
   step time (robust to other jobs taking the cores of a shared host for a moment); the slowdown
   compares the medians over trials.

    .venv/bin/python bench/metric_ingest.py [--steps 20000] [--metrics 10] [--trials 7] [--step device|matmul]
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Progress:  # what jaxengine.trainer.Progress carries
    step: int
    total_steps: int
    metrics: dict
    elapsed_seconds: float
    tokens_seen: int


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)  # x --metrics = 200,000 points
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--overhead-steps", type=int, default=600)
    parser.add_argument("--overhead-metrics", type=int, default=32)
    parser.add_argument("--step", choices=["device", "matmul"], default="device")
    parser.add_argument("--step-ms", type=float, default=5.0, help="device step: milliseconds per step")
    parser.add_argument("--matmul", type=int, default=512, help="matmul step: size of the square matmul")
    return parser.parse_args()


def start_redis(workdir: Path):
    executable = shutil.which("redis-server")
    if executable is None:
        return None, None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([executable, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(workdir)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(0.5)
    return process, f"redis://127.0.0.1:{port}/0"


def setup_django(data_root: Path, redis_url: str | None) -> None:
    os.environ["TEMPER_DATA"] = str(data_root)
    (data_root / "staticfiles").mkdir(parents=True)
    os.environ["DJANGO_SETTINGS_MODULE"] = "webapp.settings"
    if redis_url:
        os.environ["REDIS_URL"] = redis_url
    for name in ("DATABASE_URL", "TEMPER_MODELS_ROOT"):
        os.environ.pop(name, None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)


def make_run(name: str):
    from django.contrib.auth import get_user_model

    from tests.webapp.factories import make_base_model, make_ready_version
    from webapp.celery import app
    from webapp.projects.models import Project
    from webapp.projects.services import project_create
    from webapp.runs import reporting, services

    app.send_task = lambda *args, **kwargs: None  # no worker here: the reporter is driven directly
    users = get_user_model().objects
    owner = users.filter(username="bench").first() or users.create_user("bench", password="unused-password")
    project = Project.objects.filter(slug="bench").first() or project_create(name="Bench", slug="bench", owner=owner)
    spec = {"task": "sft", "model": make_base_model(project, name=name, path=f"/m/{name}").public_id,
            "data": {"train": make_ready_version(project, name=name).public_id}, "train": {"max_steps": 10**6}}
    run = services.run_create(project=project, spec=spec, user=owner, name=name)
    return reporting.run_start(run_pk=run.pk, attempt=1, worker_name="bench")


def record(step: int, metric_count: int) -> Progress:
    metrics = {"step": step, "loss": 1.0 / step, "tokens": step * 512}
    metrics.update({f"metric_{index}": float(index) / step for index in range(metric_count - 2)})
    return Progress(step=step, total_steps=10**6, metrics=metrics, elapsed_seconds=step * 0.01, tokens_seen=step * 512)


def ingest(args, use_redis: bool) -> None:
    from webapp.runs.models import MetricPoint
    from webapp.runs.reporting import RunReporter

    run = make_run(f"ingest-{use_redis}")
    records = [record(step, args.metrics) for step in range(1, args.steps + 1)]
    reporter = RunReporter(run=run, use_redis=use_redis)
    reporter.start()
    started = time.perf_counter()
    cpu_started = time.process_time()
    call_seconds = 0.0
    for item in records:
        before = time.perf_counter()
        reporter.on_progress(item)
        call_seconds += time.perf_counter() - before
    reporter.close()
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    stored = MetricPoint.objects.filter(run=run).count()
    # CPU of this process (writer thread, SQLite, Redis client; the feeding loop is a small part).
    print(f"ingest ({'DB + Redis publish' if use_redis else 'DB only'}): {stored} points in {seconds:.2f} s = "
          f"{stored / seconds:,.0f} points/s; on_progress on the training thread: "
          f"{1e6 * call_seconds / len(records):.1f} µs per step; CPU {1e3 * cpu_seconds / stored * 1000:.0f} ms "
          f"per 1,000 points = {100 * cpu_seconds / stored * 5000:.0f}% of one core at 5,000 points/s")


def overhead(args, use_redis: bool) -> None:
    from webapp.runs.reporting import RunReporter

    matrix = np.random.default_rng(0).standard_normal((args.matmul, args.matmul), dtype=np.float32)

    def loop(on_progress) -> float:
        # The median step of a trial: robust to the moments other jobs on a shared host take the cores.
        durations = []
        for step in range(1, args.overhead_steps + 1):
            started = time.perf_counter()
            if args.step == "device":
                time.sleep(args.step_ms / 1000)  # releases the GIL, like waiting on the device
            else:
                np.dot(matrix, matrix)
            if on_progress is not None:
                on_progress(record(step, args.overhead_metrics))
            durations.append(time.perf_counter() - started)
        return statistics.median(durations)

    if not args.trials:
        return
    loop(None)  # warm-up
    bare, reported = [], []
    for trial in range(args.trials):
        bare.append(loop(None))
        reporter = RunReporter(run=make_run(f"overhead-{use_redis}-{trial}"), use_redis=use_redis)
        reporter.start()
        reported.append(loop(reporter.on_progress))
        reporter.close()
    base, with_reporter = statistics.median(bare), statistics.median(reported)
    rate = args.overhead_metrics / with_reporter
    print(f"overhead ({args.step} step, {'DB + Redis' if use_redis else 'DB only'}): step {1e3 * base:.2f} ms bare, "
          f"{1e3 * with_reporter:.2f} ms reported ({args.overhead_metrics} metrics/step = {rate:,.0f} points/s): "
          f"{100 * (with_reporter - base) / base:+.1f}% (trials bare {[round(1e3 * t, 2) for t in bare]}, "
          f"reported {[round(1e3 * t, 2) for t in reported]} ms)")


def main() -> None:
    args = parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="temper-bench-ingest-"))
    redis_process, redis_url = start_redis(workdir)
    try:
        setup_django(workdir / "data", redis_url)
        for use_redis in ([False, True] if redis_url else [False]):
            ingest(args, use_redis)
        for use_redis in ([False, True] if redis_url else [False]):
            overhead(args, use_redis)
    finally:
        if redis_process is not None:
            redis_process.terminate()
            redis_process.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
