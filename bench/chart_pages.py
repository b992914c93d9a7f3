"""Browser time of the chart pages with Temper's plotly bundle against the full plotly.js bundle.

Builds a throwaway SQLite database (production settings, collectstatic: files hashed and gzipped as the
default setup serves them, through WhiteNoise) holding a run with a few line charts, a comparison of three
runs (line charts and the hyperparameters' parallel coordinates) and a dataset version with length
histograms, serves it from an in-process live server and loads each page in headless Chromium ``--loads``
times per bundle, alternating, each load in a fresh browser context (an empty cache, as a first visit).
The full bundle (``--old-bundle``; by default static/vendor/plotly.min.js as the commit before its
removal held it) is put in the static root beside the page's, gzipped as collectstatic gzips, and the page's
request for its bundle is sent there instead, so both load the same page, data and server in one run.

For each load it reads:

- ``drawn``: milliseconds from the navigation's start until every chart of the page holds plotly's drawing;
- ``KB``: bytes the page's responses took on the wire (compressed bodies, as Chromium counts them).

Prints the median and range of each per page and bundle.

    .venv/bin/python bench/chart_pages.py [--loads 7] [--cpu-slowdown 1] [--old-bundle PATH]
"""
from __future__ import annotations

import argparse
import gzip
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pages import logged_in_server, setup_django  # noqa: E402

OLD_PATH = "static/vendor/plotly.min.js"
# Every chart of the page drawn: a line chart or histogram holds plotly's SVG, the parallel coordinates its axes.
DRAWN = """selector => { const plots = document.querySelectorAll(selector);
  return plots.length > 0 && [...plots].every(plot => plot.querySelector('.scatterlayer .trace, .barlayer .trace, g.parcoords')); }"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=7, help="loads per page and bundle")
    parser.add_argument("--cpu-slowdown", type=float, default=1.0,
                        help="Chromium's CPU throttling rate (4: a page as a four times slower machine runs it)")
    parser.add_argument("--old-bundle", type=Path, default=None,
                        help=f"the bundle to compare with; by default {OLD_PATH} from git, before its removal")
    return parser.parse_args()


def old_bundle(path: Path | None) -> bytes:
    if path:
        return path.read_bytes()
    removed_in = subprocess.run(["git", "rev-list", "-1", "HEAD", "--", OLD_PATH], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout.strip()
    return subprocess.run(["git", "show", f"{removed_in}^:{OLD_PATH}"], cwd=ROOT, check=True,
                          capture_output=True).stdout


def redirect_to(url: str):
    """A route handler that sends the request to ``url`` instead (Playwright passes the request too where a
    handler takes two arguments, so the address cannot be a default argument)."""
    return lambda route: route.continue_(url=url)


def populate() -> tuple:
    """The owner and the address of each chart page, with the selector of its charts."""
    import math

    from django.contrib.auth import get_user_model

    from tests.webapp.factories import make_ready_version
    from webapp.datasets.models import DatasetVersion
    from webapp.projects.services import project_create
    from webapp.runs.models import MetricPoint, Run, RunStatus

    owner = get_user_model().objects.create_user("bench-owner", password="unused-password")
    project = project_create(name="Bench", slug="bench", owner=owner)
    runs = []
    for index, rate in enumerate((1e-4, 3e-4, 1e-3)):
        run = Run.objects.create(project=project, name=f"lr {rate:g}", task="sft", status=RunStatus.SUCCEEDED,
                                 spec={"task": "sft", "optim": {"learning_rate": rate, "schedule": "cosine"}},
                                 resolved_spec={"output_dir": "/nowhere"}, created_by=owner, total_steps=200,
                                 current_step=200, final_metrics={"loss": {"last": 1.0 / (index + 1), "min": 0.1,
                                                                           "max": 4.0}})
        MetricPoint.objects.bulk_create(
            [MetricPoint(run=run, step=step, name=name, value=math.exp(-step / 80) * (index + 1) + offset,
                         wall_time=float(step), tokens=step * 100)
             for offset, name in enumerate(("loss", "grad_norm", "learning_rate")) for step in range(1, 201)])
        runs.append(run)
    version = make_ready_version(project, user=owner)
    histograms = {"fields": {field: {"count": 8, "min": 2, "max": 30, "mean": 12.5, "p50": 11, "p90": 25, "p99": 30,
                                     "histogram": {"edges": [0, 10, 20, 30], "counts": [3, 4, 1]}}
                             for field in ("completion", "prompt")}}
    DatasetVersion.objects.filter(pk=version.pk).update(
        statistics=histograms, token_statistics={"status": "ready", "base_model": "tiny", "rows": 8, "sampled": False,
                                                 "fields": {"completion": histograms["fields"]["completion"]}})
    pages = {
        "run (3 line charts)": (f"/p/bench/runs/{runs[0].public_id}/", "#charts .plot"),
        "compare (3 line charts, parcoords)": ("/p/bench/runs/compare/?" + "&".join(f"runs={run.public_id}" for run in runs),
                                               "#compare-charts .plot, #hyperparameters-plot"),
        "dataset version (3 histograms)": (f"/p/bench/datasets/{version.dataset.public_id}/v/{version.number}/",
                                           ".plot[data-chart-source]"),
    }
    return owner, pages


def main() -> None:
    args = parse_args()
    full_bundle = old_bundle(args.old_bundle)
    with tempfile.TemporaryDirectory() as temporary:
        setup_django(Path(temporary))
        from django.conf import settings
        from django.templatetags.static import static
        from playwright.sync_api import sync_playwright

        # Beside collectstatic's files, gzipped as it gzips them: WhiteNoise serves the .gz to a browser that takes it.
        full_name = "vendor/plotly-full.min.js"
        (Path(settings.STATIC_ROOT) / full_name).write_bytes(full_bundle)
        (Path(settings.STATIC_ROOT) / f"{full_name}.gz").write_bytes(gzip.compress(full_bundle, compresslevel=9))
        bundles = {"temper (scatter, bar, parcoords)": None, "full plotly.js": f"{settings.STATIC_URL}{full_name}"}
        ours = static("vendor/plotly-temper.min.js")

        owner, pages = populate()
        figures = {(page_name, bundle): {"drawn": [], "bytes": []} for page_name in pages for bundle in bundles}
        with logged_in_server(owner) as (base, session), sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium")
            for index in range(args.loads + 1):  # the first round warms the server
                for page_name, (path, selector) in pages.items():
                    for bundle, replacement in bundles.items():
                        context = browser.new_context(viewport={"width": 1280, "height": 900})
                        context.add_cookies([{"name": "sessionid", "value": session, "url": base}])
                        page = context.new_page()
                        if args.cpu_slowdown != 1:
                            context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate",
                                                               {"rate": args.cpu_slowdown})
                        if replacement:
                            page.route(f"**{ours}", redirect_to(base + replacement))
                        responses = []
                        page.on("requestfinished", lambda request: responses.append(request))
                        started = time.monotonic()
                        page.goto(base + path, wait_until="commit")
                        page.wait_for_function(DRAWN, arg=selector, polling="raf", timeout=120_000)
                        drawn = page.evaluate("performance.now()")  # from the navigation's start
                        page.wait_for_load_state("load")
                        wire = sum(request.sizes()["responseBodySize"] + request.sizes()["responseHeadersSize"]
                                   for request in responses)
                        context.close()
                        assert time.monotonic() - started < 120
                        if index:
                            figures[(page_name, bundle)]["drawn"].append(drawn)
                            figures[(page_name, bundle)]["bytes"].append(wire)
            browser.close()
    print(f"chart pages, {args.loads} loads each in a fresh context, CPU slowdown {args.cpu_slowdown:g}")
    print("| page | bundle | charts drawn, ms: median (min-max) | KB on the wire, median |")
    print("| --- | --- | --- | --- |")
    for (page_name, bundle), values in figures.items():
        drawn = values["drawn"]
        print(f"| {page_name} | {bundle} | {statistics.median(drawn):.0f} ({min(drawn):.0f}-{max(drawn):.0f}) | "
              f"{statistics.median(values['bytes']) / 1024:.0f} |")


if __name__ == "__main__":
    main()
