"""Server time of the runs table and the compare page at scale.

Builds a throwaway SQLite database (production settings: DEBUG off, WAL) with one project holding
``--runs`` runs (tags, final metrics, a base model and a dataset version each), ten of which carry
``--points`` metric points each (``--metrics`` metrics over points / metrics steps) and a few eval
samples. The ten are running: like the train worker, each keeps its downsampled buckets on its row
(``Run.series_cache``), stored ``--tail-steps`` steps before its last (the worker stores them every
5 s, so a page reduces at most a few seconds of new points; 1,000 steps is a generous tail). Then it
requests pages through Django's in-process test client (the whole server path:
middleware, session, access check, queries, downsampling, template). Prints the median, 95th
percentile and maximum over ``--requests`` requests per page after a warm-up, and the median CPU
time of this process per request (the database is SQLite, in process, so it counts the queries'
work too): on a loaded host, where wall time mostly measures waiting for a core, that is the figure
to compare; and the number of SQL queries one request makes. The run page's ``state.json`` poll is timed
with nothing new, and with 20 new steps (on the second run, whose ``eval/loss`` every 500 steps lags
the other metrics: the poll names each metric's own last step in ``after_steps``). ``--short-runs`` more running runs of
300 steps (no stored buckets yet, as in a run's first seconds) join the ten on a second compare page.
``--dump DIR`` writes each compare page's chart data (its ``compare-data`` JSON) to DIR, to check that a
change of how the series are read leaves them as they were: ``--same-as DIR`` (of another tree's run) says
whether each page's series, names and runs are those written there (run-0's id is drawn anew each time).

    .venv/bin/python bench/runs_pages.py [--runs 1000] [--points 100000] [--metrics 4] [--tail-steps 1000]
                                         [--short-runs 4] [--requests 30] [--dump DIR] [--same-as DIR]
"""
from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pages import bench_project, setup_django  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--metrics", type=int, default=4)
    parser.add_argument("--tail-steps", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--short-runs", type=int, default=4)
    parser.add_argument("--dump", type=Path, default=None)
    parser.add_argument("--same-as", type=Path, default=None)
    return parser.parse_args()


EVAL_EVERY = 500
POLL_NEW_STEPS = 20  # the steps a 2 s poll finds new, at 10 steps a second


def populate(args):
    from webapp.runs import services
    from webapp.runs.models import MetricPoint, Run, Sample
    from webapp.runs.selectors import series_buckets

    owner, project, model, data = bench_project()
    rng = random.Random(0)
    template = services.run_create(project=project, spec={"task": "sft", "model": model.public_id,
                                                          "data": {"train": data.public_id},
                                                          "train": {"max_steps": 1000}}, user=owner, name="run-0")
    runs = [template]
    for index in range(1, args.runs):
        run = Run(project=project, name=f"run-{index}", task="sft", spec=template.spec,
                  resolved_spec=template.resolved_spec, status=rng.choice(["succeeded", "failed", "cancelled"]),
                  created_by=owner, total_steps=1000, current_step=1000, base_model=model, train_seconds=600.0,
                  tags=rng.sample(["baseline", "sweep", "lora", "dpo", "long"], 2),
                  final_metrics={"loss": {"last": rng.random(), "min": 0.1, "max": 3.0, "step": 1000},
                                 "eval/loss": {"last": rng.random(), "min": 0.2, "max": 3.1, "step": 1000}})
        run.public_id = f"run_bench{index:011d}"
        runs.append(run)
    Run.objects.bulk_create(runs[1:], batch_size=500)
    runs = list(Run.objects.filter(project=project).order_by("id"))
    Run.dataset_versions.through.objects.bulk_create(
        [Run.dataset_versions.through(run_id=run.pk, datasetversion_id=data.pk) for run in runs[1:]], batch_size=1000)
    compared = runs[:10]
    steps = args.points // args.metrics
    Run.objects.filter(pk__in=[run.pk for run in compared]).update(current_step=steps, total_steps=steps)
    Run.objects.filter(pk__in=[run.pk for run in compared]).update(status="running")
    stored_through = max(0, steps - args.tail_steps)
    for run in compared:
        points = [MetricPoint(run=run, step=step, name=f"metric_{metric}", value=rng.random() / step,
                              wall_time=1e9 + step, tokens=step * 512)
                  for metric in range(args.metrics) for step in range(1, steps + 1)]
        MetricPoint.objects.bulk_create([point for point in points if point.step <= stored_through], batch_size=5000)
        run.current_step, run.status = stored_through, "running"
        Run.objects.filter(pk=run.pk).update(series_cache={"buckets": series_buckets(run=run).to_json()})
        MetricPoint.objects.bulk_create([point for point in points if point.step > stored_through], batch_size=5000)
        run.current_step = steps
        Sample.objects.bulk_create([Sample(run=run, step=steps, position=position, prompt=f"prompt {position}",
                                           text=f"answer {position} of {run.name}") for position in range(8)])
    # The second run also logs an evaluation every EVAL_EVERY steps: a metric that lags the others.
    MetricPoint.objects.bulk_create([MetricPoint(run=compared[1], step=step, name="eval/loss", value=rng.random() / step,
                                                 wall_time=1e9 + step, tokens=step * 512)
                                     for step in range(EVAL_EVERY, steps + 1, EVAL_EVERY)])
    short = runs[10:10 + args.short_runs]
    Run.objects.filter(pk__in=[run.pk for run in short]).update(status="running", current_step=300, total_steps=1000,
                                                                series_cache={})
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name=f"metric_{metric}", value=rng.random() / step,
                                                 wall_time=2e9 + step, tokens=step * 256)
                                     for run in short for metric in range(args.metrics) for step in range(1, 301)],
                                    batch_size=5000)
    return owner, compared, short


def finish(runs) -> None:
    """What ``run_finish`` does for the compare page: keep each run's downsampled series."""
    from webapp.runs.models import Run, RunStatus
    from webapp.runs.selectors import series_cache_for

    for run in runs:
        run.status = RunStatus.SUCCEEDED
        Run.objects.filter(pk=run.pk).update(status=run.status, series_cache=series_cache_for(run))


def timed(client, url: str, *, requests: int, warmup: int) -> tuple[list[float], list[float], int, int]:
    from django.core.signals import request_started
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    for _ in range(warmup):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
    # A request's start empties the log of queries that the count reads.
    request_started.disconnect(reset_queries)
    with CaptureQueriesContext(connection) as queries:
        client.get(url)
    request_started.connect(reset_queries)
    query_count = len(queries)  # read from the log, which the next request empties
    durations, cpu = [], []
    for _ in range(requests):
        started, started_cpu = time.perf_counter(), time.process_time()
        response = client.get(url)
        durations.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return durations, cpu, len(response.content), query_count


def main() -> None:
    args = parse_args()
    setup_django(Path(tempfile.mkdtemp(prefix="temper-bench-runs-")))
    from django.test import Client

    from webapp.runs.models import Run

    started = time.perf_counter()
    owner, compared, short = populate(args)
    print(f"populated {args.runs} runs, {len(compared)} x {args.points} points in {time.perf_counter() - started:.0f} s")
    client = Client()
    client.force_login(owner)
    query = "&".join(f"runs={run.public_id}" for run in compared)
    live = {
        f"runs table ({args.runs} runs, page of 50)": "/p/bench/runs/",
        "runs table, tag filter + sort": "/p/bench/runs/?tag=sweep&sort=name",
        f"compare 10 running runs x {args.points} pts": f"/p/bench/runs/compare/?{query}",
        f"run page ({args.points} points)": f"/p/bench/runs/{compared[0].public_id}/",
    }
    # What a run page asks every 2 s while polling (every 30 s once the run is finished) when nothing is new.
    unchanged_poll = f"/p/bench/runs/{compared[0].public_id}/state.json?after_step={compared[0].current_step}&after_log=0"
    live["state poll of a running run, nothing new"] = unchanged_poll
    # What a polling page asks every 2 s when the run logged POLL_NEW_STEPS steps since: its metrics stand
    # at steps - POLL_NEW_STEPS, and on the second run an eval stands at the last multiple of EVAL_EVERY
    # before (after_step, the smallest, with after_steps, each other metric's own step).
    seen = compared[0].current_step - POLL_NEW_STEPS
    live["state poll of a running run, 20 new steps"] = (
        f"/p/bench/runs/{compared[0].public_id}/state.json?after_step={seen}&after_log=0")
    own_steps = json.dumps({f"metric_{metric}": seen for metric in range(args.metrics)}, separators=(",", ":"))
    live["state poll, 20 new steps, an eval lags"] = (
        f"/p/bench/runs/{compared[1].public_id}/state.json?after_step={seen // EVAL_EVERY * EVAL_EVERY}"
        f"&after_steps={quote(own_steps)}&after_log=0")
    if short:
        mixed = "&".join(f"runs={run.public_id}" for run in [*compared, *short])
        live[f"compare 10 running + {len(short)} x 300 steps"] = f"/p/bench/runs/compare/?{mixed}"
    print(f"{'page':46} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'cpu ms':>8} {'KiB':>6} {'queries':>7}")
    measure(client, live, args)
    stored = {run.pk: Run.objects.get(pk=run.pk).series_cache for run in compared}
    Run.objects.filter(pk__in=list(stored)).update(series_cache={})
    measure(client, {"compare 10 running runs, no stored buckets": f"/p/bench/runs/compare/?{query}"}, args)
    for pk, cache in stored.items():
        Run.objects.filter(pk=pk).update(series_cache=cache)
    finish(compared)
    measure(client, {f"compare 10 finished runs x {args.points} pts": f"/p/bench/runs/compare/?{query}",
                     "state poll of a finished run, nothing new": unchanged_poll}, args)


def measure(client, pages: dict[str, str], args) -> None:
    for label, url in pages.items():
        durations, cpu, size, queries = timed(client, url, requests=args.requests, warmup=args.warmup)
        durations.sort()
        p95 = durations[min(len(durations) - 1, int(round(0.95 * (len(durations) - 1))))]
        print(f"{label:46} {1e3 * statistics.median(durations):8.1f} {1e3 * p95:8.1f} {1e3 * durations[-1]:8.1f} "
              f"{1e3 * statistics.median(cpu):8.1f} {size / 1024:6.0f} {queries:7d}")
        if args.dump and "/compare/" in url:
            page = client.get(url).content.decode()
            data = re.search(r'<script id="compare-data" type="application/json">(.*?)</script>', page, re.S).group(1)
            args.dump.mkdir(parents=True, exist_ok=True)
            name = re.sub(r"\W+", "-", label).strip("-") + ".json"
            (args.dump / name).write_text(json.dumps(json.loads(data), sort_keys=True))
            if args.same_as:
                print(f"  chart data {'the same as' if same_chart_data(args.same_as / name, args.dump / name) else 'NOT the same as'}"
                      f" {args.same_as / name}")


def same_chart_data(before: Path, after: Path) -> bool:
    """Whether two compare pages' chart data draw the same: runs compared by their place, as run-0's id differs."""
    first, second = json.loads(before.read_text()), json.loads(after.read_text())

    def drawn(data):
        return ([data["series"][run["id"]] for run in data["runs"]], data["names"],
                [{**run, "id": None} for run in data["runs"]])

    return drawn(first) == drawn(second)


if __name__ == "__main__":
    main()
