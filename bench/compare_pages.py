"""Server and browser time of the runs compare page for 2, 4 and 8 runs.

Builds a throwaway SQLite database (production settings, collectstatic) with one project of 8 finished
SFT runs, each ``--metrics`` metric names over ``--steps`` steps (8 x 1,000: 8,000 points a run), an
evaluation every 100 steps with 8 generation samples of ~1 KB each, and a full resolved config whose
learning rate, seed and LoRA rank differ between runs. Each run keeps its downsampled series as
``run_finish`` stores them (``Run.series_cache``).

Server: the compare page of the first 2, 4 and 8 runs through Django's in-process test client (the
whole server path); the median wall and CPU time of this process over ``--requests`` requests after a
warm-up, the page's size and its SQL queries. On a loaded host the CPU column is the one to compare.

Browser (unless ``--no-browser``): the same pages from a live server in headless Chromium, each load
in a fresh context; milliseconds from the navigation's start to the first animation frame at which the metric
charts hold plotly's drawing (as bench/chart_pages.py reads it but checked in the page's own frames); the main
thread's long tasks (over 50 ms, summed) in the ``BUSY_MS`` after that frame, the reader not scrolling; then the
page is scrolled to the hyperparameters' parallel coordinates (below the fold at 1280x900), and the milliseconds
from that scroll to the first frame at which every chart holds its drawing (0 where they were drawn before it:
drawn at load, as before they waited to be scrolled near); and the number of ``Plotly.react`` calls the page made
by half a second after.

    .venv/bin/python bench/compare_pages.py [--steps 1000] [--metrics 8] [--requests 10] [--loads 5] [--no-browser]
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

from bench.chart_pages import DRAWN  # noqa: E402
from bench.pages import bench_project, logged_in_server, setup_django  # noqa: E402
from bench.runs_pages import finish, timed  # noqa: E402

SIZES = (2, 4, 8)
EVAL_EVERY = 100
SAMPLES_PER_EVAL = 8
# Counts the page's Plotly.react calls (wrapping plotly's once the bundle has set it), and notes the time of the first
# animation frame at which the metric charts (__lines), then every chart (__drawn), hold plotly's drawing, and the
# main thread's long tasks (__longTasks: [start, duration]). Checked in the page's own frames from its start: a
# check sent from here waits for a main thread busy with a drawing.
WATCH = """(() => { let plotly; window.__reacts = 0; window.__longTasks = [];
  new PerformanceObserver(list => list.getEntries().forEach(task => window.__longTasks.push([task.startTime, task.duration])))
    .observe({ type: "longtask", buffered: true });
  Object.defineProperty(window, "Plotly", { configurable: true, get() { return plotly; }, set(value) {
    const react = value.react; value.react = function () { window.__reacts += 1; return react.apply(this, arguments); };
    plotly = value; } });
  const drawn = %s;
  const watch = () => {
    if (!window.__lines && drawn("#compare-charts .plot")) window.__lines = performance.now();
    if (window.__lines && !window.__drawn && drawn("#compare-charts .plot, #hyperparameters-plot")) window.__drawn = performance.now();
    if (!window.__drawn) requestAnimationFrame(watch); };
  requestAnimationFrame(watch); })();""" % DRAWN
# How long after the metric charts show the main thread's long tasks are counted, before the page is scrolled.
BUSY_MS = 3000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--metrics", type=int, default=8)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--no-browser", action="store_true")
    return parser.parse_args()


def populate(args):
    from webapp.runs import services
    from webapp.runs.models import MetricPoint, Run, Sample

    owner, project, model, data = bench_project()
    rng = random.Random(0)
    names = ["loss", "grad_norm", "learning_rate", "eval/loss", "tokens_per_second", "eval/accuracy", "train/perplexity",
             "memory_gb"][:args.metrics] + [f"metric_{index}" for index in range(8, args.metrics)]
    runs = []
    for index in range(max(SIZES)):
        spec = {"task": "sft", "model": model.public_id, "data": {"train": data.public_id},
                "train": {"max_steps": args.steps, "seed": index},
                "optim": {"learning_rate": 1e-4 * (index + 1), "schedule": "cosine"},
                "peft": {"method": "lora", "rank": 8 * (1 + index % 3), "alpha": 32}}
        run = services.run_create(project=project, spec=spec, user=owner, name=f"sweep-{index}")
        points = [MetricPoint(run=run, step=step, name=name, value=(1 + rng.random()) / step ** 0.3 + offset,
                              wall_time=1e9 + step, tokens=step * 512)
                  for offset, name in enumerate(names) for step in range(1, args.steps + 1)
                  if not name.startswith("eval/") or step % EVAL_EVERY == 0]
        MetricPoint.objects.bulk_create(points, batch_size=5000)
        Sample.objects.bulk_create([
            Sample(run=run, step=step, position=position, prompt=f"prompt {position}: " + "question text " * 40,
                   text=f"answer {position} of {run.name} at {step}: " + "generated words " * 60)
            for step in range(EVAL_EVERY, args.steps + 1, EVAL_EVERY) for position in range(SAMPLES_PER_EVAL)])
        Run.objects.filter(pk=run.pk).update(
            current_step=args.steps, total_steps=args.steps, train_seconds=600.0,
            final_metrics={name: {"last": rng.random(), "min": 0.1, "max": 3.0, "step": args.steps} for name in names})
        runs.append(Run.objects.get(pk=run.pk))
    finish(runs)
    return owner, {size: "/p/bench/runs/compare/?" + "&".join(f"runs={run.public_id}" for run in runs[:size])
                   for size in SIZES}


def server(owner, pages: dict[int, str], args) -> None:
    from django.test import Client

    client = Client()
    client.force_login(owner)
    print(f"{'server':20} {'p50 ms':>8} {'cpu ms':>8} {'KiB':>6} {'chart data KiB':>14} {'queries':>7}")
    for size, url in pages.items():
        durations, cpu, size_bytes, queries = timed(client, url, requests=args.requests, warmup=args.warmup)
        page = client.get(url).content.decode()
        chart_data = page.split('<script id="compare-data" type="application/json">')[1].split("</script>")[0]
        print(f"{f'compare {size} runs':20} {1e3 * statistics.median(durations):8.1f} "
              f"{1e3 * statistics.median(cpu):8.1f} {size_bytes / 1024:6.0f} {len(chart_data.encode()) / 1024:14.0f} "
              f"{queries:7d}")


def browser(owner, pages: dict[int, str], args) -> None:
    from playwright.sync_api import sync_playwright

    figures = {size: {"lines": [], "busy": [], "drawn": [], "reacts": []} for size in pages}
    with logged_in_server(owner) as (base, session), sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path="/usr/bin/chromium")
        for index in range(args.loads + 1):  # the first round warms the server
            for size, path in pages.items():
                context = chromium.new_context(viewport={"width": 1280, "height": 900})
                context.add_cookies([{"name": "sessionid", "value": session, "url": base}])
                page = context.new_page()
                page.add_init_script(WATCH)
                page.goto(base + path, wait_until="commit")
                page.wait_for_function("window.__lines", timeout=120_000)
                lines = page.evaluate("window.__lines")
                page.wait_for_function(f"performance.now() > window.__lines + {BUSY_MS}", timeout=120_000)
                busy = page.evaluate(f"""window.__longTasks.filter(([start]) => start >= window.__lines
                    && start < window.__lines + {BUSY_MS}).reduce((sum, [, duration]) => sum + duration, 0)""")
                # Two runs get no parallel coordinates.
                scrolled = page.evaluate("""() => { const plot = document.getElementById('hyperparameters-plot');
                    if (plot) plot.scrollIntoView(); return performance.now(); }""")
                page.wait_for_function("window.__drawn", timeout=120_000)
                page.wait_for_timeout(500)  # the redraws that follow the first drawing (legends' room)
                drawn, reacts = page.evaluate("[window.__drawn, window.__reacts]")
                context.close()
                if index:
                    figures[size]["lines"].append(lines)
                    figures[size]["busy"].append(busy)
                    figures[size]["drawn"].append(max(0.0, drawn - scrolled))
                    figures[size]["reacts"].append(reacts)
        chromium.close()
    print(f"browser, {args.loads} loads each, median (min-max): ms from the navigation's start to the metric charts "
          f"drawn; ms of long tasks in the {BUSY_MS} ms after, not scrolled; ms from the scroll to the hyperparameters' "
          "parallel coordinates (from 3 runs) to every chart drawn; Plotly.react calls")
    for size, values in figures.items():
        print(f"compare {size} runs: " + "; ".join(f"{statistics.median(values[key]):.0f} ({min(values[key]):.0f}-"
                                                    f"{max(values[key]):.0f})" for key in ("lines", "busy", "drawn"))
              + f"; {statistics.median(values['reacts']):.0f} reacts")


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="temper-bench-compare-") as temporary:
        setup_django(Path(temporary))
        started = time.perf_counter()
        owner, pages = populate(args)
        print(f"populated {max(SIZES)} runs in {time.perf_counter() - started:.0f} s")
        server(owner, pages, args)
        if not args.no_browser:
            browser(owner, pages, args)


if __name__ == "__main__":
    main()
