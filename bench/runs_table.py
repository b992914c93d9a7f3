"""Server time of the runs table as a project's runs grow: its sort menu, tag menu and search.

Builds a throwaway SQLite database (production settings: DEBUG off, WAL) with one project of ``--runs`` finished
runs, each with two or three of ``--tags`` tags and ``--metrics`` final metrics (a finished run's summary: last,
min, max and step of each), then requests the table through Django's in-process test client (the whole server
path: middleware, session, access check, queries, template): as it opens, sorted by a final metric, and searched
for a part of a tag. Prints the median and 95th percentile wall time over ``--requests`` requests per page after a
warm-up, the median CPU time of this process per request (SQLite runs in process, so it counts the queries' work
too: the figure to compare on a loaded host) and the number of SQL queries of one request.

The runs are made in bulk, past the services; the table's indexes (``RunTag``, ``ProjectMetricName``) are written
for them as the services would. A tree from before those indexes has neither, and the same script measures it.

    .venv/bin/python bench/runs_table.py [--runs 2000] [--metrics 12] [--tags 40] [--requests 30]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pages import bench_project, setup_django  # noqa: E402
from bench.runs_pages import timed  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--metrics", type=int, default=12)
    parser.add_argument("--tags", type=int, default=40)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    return parser.parse_args()


def populate(args):
    from webapp.runs import services
    from webapp.runs.models import Run

    owner, project, model, data = bench_project()
    template = services.run_create(project=project, spec={"task": "sft", "model": model.public_id,
                                                          "data": {"train": data.public_id},
                                                          "train": {"max_steps": 1000}}, user=owner, name="run-0")
    rng = random.Random(0)
    tags = [f"{rng.choice(['sweep', 'lora', 'dpo', 'baseline', 'ablation'])}-{index}" for index in range(args.tags)]
    metrics = ["loss", "eval/loss", "learning_rate", "grad_norm", "tokens", "tokens_per_second", "epoch",
               *(f"eval/metric_{index}" for index in range(max(0, args.metrics - 7)))][:args.metrics]
    runs = []
    for index in range(1, args.runs):
        run = Run(project=project, name=f"run-{index}", task="sft", spec=template.spec,
                  resolved_spec=template.resolved_spec, status="succeeded", created_by=owner, total_steps=1000,
                  current_step=1000, base_model=model, train_seconds=600.0, tags=rng.sample(tags, rng.choice((2, 3))),
                  final_metrics={name: {"last": rng.random(), "min": 0.1, "max": 3.0, "step": 1000} for name in metrics})
        run.public_id = f"run_bench{index:011d}"
        runs.append(run)
    Run.objects.bulk_create(runs, batch_size=500)
    Run.dataset_versions.through.objects.bulk_create(
        [Run.dataset_versions.through(run_id=run.pk, datasetversion_id=data.pk)
         for run in Run.objects.filter(project=project).exclude(pk=template.pk)], batch_size=1000)
    write_indexes(project)
    return owner, tags[0]


def write_indexes(project) -> None:
    """The runs table's indexes of the runs made in bulk, as ``services.run_tags_write`` and
    ``services.metric_names_note`` write them for each run."""
    try:
        from webapp.runs.models import ProjectMetricName, RunTag, fold_tag
    except ImportError:  # a tree from before them: the table reads the runs themselves
        return
    from webapp.runs.models import Run

    names = set()
    rows = []
    for run_id, tags, final_metrics in Run.objects.filter(project=project).values_list("pk", "tags", "final_metrics"):
        rows += [RunTag(run_id=run_id, project=project, tag=tag, tag_folded=fold_tag(tag)) for tag in tags]
        names.update(final_metrics)
    RunTag.objects.bulk_create(rows, batch_size=1000)
    ProjectMetricName.objects.bulk_create([ProjectMetricName(project=project, name=name) for name in sorted(names)])


def main() -> None:
    args = parse_args()
    setup_django(Path(tempfile.mkdtemp(prefix="temper-bench-runs-table-")))
    from django.test import Client

    started = time.perf_counter()
    owner, tag = populate(args)
    print(f"populated {args.runs} runs, {args.metrics} final metrics and 2-3 of {args.tags} tags each, in "
          f"{time.perf_counter() - started:.0f} s")
    client = Client()
    client.force_login(owner)
    pages = {
        f"runs table ({args.runs} runs, page of 50)": "/p/bench/runs/",
        "sorted by a final metric": "/p/bench/runs/?sort=-metric:eval/loss",
        f"searched for a part of a tag ({tag[:4]!r})": f"/p/bench/runs/?q={tag[:4]}",
    }
    print(f"{'page':46} {'p50 ms':>8} {'p95 ms':>8} {'cpu ms':>8} {'queries':>7}")
    for label, url in pages.items():
        durations, cpu, _size, queries = timed(client, url, requests=args.requests, warmup=args.warmup)
        durations.sort()
        p95 = durations[min(len(durations) - 1, int(round(0.95 * (len(durations) - 1))))]
        print(f"{label:46} {1e3 * statistics.median(durations):8.1f} {1e3 * p95:8.1f} "
              f"{1e3 * statistics.median(cpu):8.1f} {queries:7d}")


if __name__ == "__main__":
    main()
