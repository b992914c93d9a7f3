"""Time of the Storage page's project-wide *Prune checkpoints of ended runs…* (``services.project_checkpoints_prune``)
and of the Storage page that offers it, as a project's runs grow: whether the prune fits in one request or needs a
Celery task.

Builds the data directory ``bench/storage_page.py`` does (``--runs`` finished runs of ``--checkpoints`` checkpoint
folders of ``--files`` files, production settings, SQLite in WAL), gives each run eval points so that its best
checkpoint is kept, then: times the Storage page (``--requests`` loads after a warm-up, with its *Pruning frees*
figures), and one prune as the worker's task runs it — every run locked in turn, each step measured, logged and
renamed, its folders removed as its transaction commits — with its SQL queries, and says what it deleted.

    .venv/bin/python bench/checkpoint_prune.py [--runs 300] [--checkpoints 5] [--files 8]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pages import setup_django  # noqa: E402
from bench.runs_pages import timed  # noqa: E402
from bench.storage_page import populate, report  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--checkpoints", type=int, default=5)
    parser.add_argument("--files", type=int, default=8, help="files in each checkpoint folder")
    parser.add_argument("--datasets", type=int, default=0)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    setup_django(Path(tempfile.mkdtemp(prefix="temper-bench-prune-")))
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from tests.webapp.runs.conftest import Catalog, sft_spec
    from tests.webapp.factories import make_base_model, make_ready_version
    from webapp.runs.models import MetricPoint, Run
    from webapp.runs.services import checkpoint_steps, project_checkpoints_prune

    owner, project, entries = populate(args)
    # A spec the engine reads, so that each run's ranking metric (eval/loss) ranks its checkpoints.
    catalog = Catalog(base_model=make_base_model(project, name="bench model", path="/models/bench-model"),
                      sft=make_ready_version(project, name="bench chats", kind="sft"),
                      preference=None, prompts=None)
    runs = list(Run.objects.filter(project=project))
    for run in runs:
        run.spec = sft_spec(catalog)
        run.resolved_spec = {**run.spec, **run.resolved_spec}
    Run.objects.bulk_update(runs, ["spec", "resolved_spec"])
    steps = [step * 100 for step in range(1, args.checkpoints + 1)]
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="eval/loss", value=1.0 + (step == 200) * -0.5
                                                 + step / 10_000, wall_time=step)
                                     for run in runs for step in steps])
    print(f"populated {args.runs} runs x {args.checkpoints} checkpoints of {args.files} files ({entries:,} entries)")
    client = Client()
    client.force_login(owner)
    durations, cpu, size, queries = timed(client, f"/p/{project.slug}/storage/", requests=args.requests,
                                          warmup=args.warmup)
    report(f"Storage page with its prune figures ({size:,} bytes of HTML)", durations, cpu, queries)
    # As the worker runs it (worker.tasks.storage): no request around it, each run's transaction committed (its
    # folders removed) in turn.
    started, started_cpu = time.perf_counter(), time.process_time()
    with CaptureQueriesContext(connection) as captured:
        result = project_checkpoints_prune(project=project, user=owner)
    took, took_cpu = time.perf_counter() - started, time.process_time() - started_cpu
    left = {len(checkpoint_steps(run)) for run in Run.objects.filter(project=project)}
    print(f"project_checkpoints_prune: {took * 1000:.0f} ms, CPU {took_cpu * 1000:.0f} ms, {len(captured)} queries; "
          f"deleted {result.checkpoints} checkpoints of {len(result.pruned)} runs ({result.bytes_freed:,} bytes); "
          f"checkpoints left per run {sorted(left)}")

if __name__ == "__main__":
    main()
