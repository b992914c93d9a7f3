"""Browser time of a run page with many charts: this tree's static/runs.js against another revision's.

Builds a throwaway SQLite database (production settings) with one finished GRPO-like run that logged
``--metrics`` metrics over ``--steps`` steps, serves it from an in-process live server, and loads the
run's page in headless Chromium ``--loads`` times for each version of ``runs.js``, alternating (the
other revision's file is served in place of this tree's by intercepting its request, so both load the
same page, data and server in one run). For each load it reads, from the browser's own timings:

- ``load``: the navigation's ``loadEventEnd`` (the page's scripts, which draw the charts, run before it);
- ``charts``: how many charts had been drawn by then (a drawn chart holds plotly's ``.main-svg``).

Prints the median and range of each per version.

    .venv/bin/python bench/run_page_charts.py [--baseline HEAD~1] [--metrics 33] [--steps 500] [--loads 7]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pages import logged_in_server, setup_django  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="HEAD~1", help="git revision whose static/runs.js is the baseline")
    parser.add_argument("--metrics", type=int, default=33)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--loads", type=int, default=7)
    return parser.parse_args()


def populate(*, metric_count: int, steps: int):
    import math

    from django.contrib.auth import get_user_model

    from webapp.projects.services import project_create
    from webapp.runs.models import MetricPoint, Run, RunStatus

    owner = get_user_model().objects.create_user("bench-owner", password="unused-password")
    project = project_create(name="Bench", slug="bench", owner=owner)
    run = Run.objects.create(project=project, name="many metrics", task="grpo", status=RunStatus.SUCCEEDED,
                             spec={"task": "grpo"}, resolved_spec={"output_dir": "/nowhere"}, created_by=owner,
                             total_steps=steps, current_step=steps)
    names = ["loss", "reward"] + [f"metric_{index:02d}" for index in range(metric_count - 2)]
    MetricPoint.objects.bulk_create(
        [MetricPoint(run=run, step=step, name=name, value=math.sin(step / 40 + offset), wall_time=float(step),
                     tokens=step * 100)
         for offset, name in enumerate(names) for step in range(1, steps + 1)], batch_size=5000)
    return owner, run


def main() -> None:
    args = parse_args()
    baseline_js = subprocess.run(["git", "show", f"{args.baseline}:static/runs.js"], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as temporary:
        setup_django(Path(temporary))
        from playwright.sync_api import sync_playwright

        owner, run = populate(metric_count=args.metrics, steps=args.steps)
        figures: dict[str, dict[str, list[float]]] = {"baseline": {"load": [], "charts": []},
                                                      "this tree": {"load": [], "charts": []}}
        with logged_in_server(owner) as (base, session), sync_playwright() as playwright:
            url = f"{base}/p/bench/runs/{run.public_id}/"
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium")
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.add_cookies([{"name": "sessionid", "value": session, "url": base}])
            page = context.new_page()
            for index in range(args.loads + 1):  # the first round warms the server and the browser's cache
                for version in ("baseline", "this tree"):
                    page.unroute("**/static/runs.*js")  # runs.<its content's hash>.js
                    if version == "baseline":
                        page.route("**/static/runs.*js", lambda route: route.fulfill(
                            status=200, content_type="text/javascript", body=baseline_js))
                    page.goto(url, wait_until="load")
                    load = page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")
                    drawn = page.evaluate("[...document.querySelectorAll('#charts .plot')]"
                                          ".filter(plot => plot.querySelector('.main-svg')).length")
                    if index:
                        figures[version]["load"].append(load)
                        figures[version]["charts"].append(drawn)
            browser.close()
    print(f"run page, {args.metrics} metrics x {args.steps} steps, {args.loads} loads each (baseline {args.baseline})")
    print("| runs.js | load ms, median (min-max) | charts drawn at load |")
    print("| --- | --- | --- |")
    for version, values in figures.items():
        loads = values["load"]
        print(f"| {version} | {statistics.median(loads):.0f} ({min(loads):.0f}-{max(loads):.0f}) | "
              f"{statistics.median(values['charts']):.0f} of {args.metrics} |")


if __name__ == "__main__":
    main()
