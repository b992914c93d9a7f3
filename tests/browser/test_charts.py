"""Every page that draws charts draws each of its traces with the plotly bundle Temper serves
(static/vendor/plotly-temper.min.js, only the trace types Temper uses: scripts/plotly_bundle/entry.js).
Plotly leaves a trace whose type its bundle lacks undrawn without a word at its default logging level,
its data still on the chart: a trace type used here and missing from the bundle fails these tests."""
import pytest

from tests.browser.test_projects import log_in
from tests.browser.test_runs import scroll_to_the_hyperparameters
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.datasets.models import DatasetVersion
from webapp.runs import services
from webapp.runs.models import MetricPoint, Run, RunStatus

pytestmark = pytest.mark.browser

# Where plotly draws a trace of each type Temper uses, one element per trace.
DRAWN_TRACES = {"scatter": ".scatterlayer .trace.scatter", "bar": ".barlayer .trace.bars", "parcoords": "g.parcoords"}

CHARTS_DRAWN = """selector => [...document.querySelectorAll(selector)].map(plot => {
    const drawn = {};
    for (const [type, traces] of Object.entries(%s)) drawn[type] = plot.querySelectorAll(traces).length;
    const asked = {};
    for (const trace of plot.data || []) asked[trace.type || "scatter"] = (asked[trace.type || "scatter"] || 0) + 1;
    return {asked: asked, drawn: drawn, canvases: plot.querySelectorAll("canvas").length};
})""" % DRAWN_TRACES


def watch_for_errors(page) -> list[str]:
    """What the page says went wrong: a script's uncaught error, a console error, a plotly warning."""
    errors = []
    page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
    page.on("console", lambda message: errors.append(f"{message.type}: {message.text}")
            if message.type in ("error", "trace") else None)
    return errors


def charts_drawn(page, selector: str) -> list[dict]:
    """Each chart of ``selector`` once plotly has drawn into it: the traces it was given by type, those drawn."""
    page.wait_for_function("selector => { const plots = document.querySelectorAll(selector);"
                           " return plots.length && [...plots].every(plot => plot.data && plot._fullLayout); }",
                           arg=selector)
    return page.evaluate(CHARTS_DRAWN, selector)


def only_drawn(charts: list[dict]) -> list[dict]:
    """The drawn count of the trace types each chart was given, to compare with what it asked for."""
    return [{type_: chart["drawn"][type_] for type_ in chart["asked"]} for chart in charts]


def histogram_statistics(*fields: str) -> dict:
    """Statistics as the validation writes them: a length histogram per field."""
    return {"fields": {field: {"count": 8, "min": 2, "max": 30, "mean": 12.5, "p50": 11, "p90": 25, "p99": 30,
                               "histogram": {"edges": [0, 10, 20, 30], "counts": [3, 4, 1]}} for field in fields}}


def test_a_runs_page_draws_its_line_charts(page, live_server, tmp_path):
    team = make_team(slug="chartsrun")
    run = Run.objects.create(project=team.project, name="drawn", task="grpo", status=RunStatus.SUCCEEDED,
                             spec={"task": "grpo"}, resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner,
                             total_steps=5, current_step=5)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name=name, value=value * step, wall_time=float(step),
                                                 tokens=step * 10)
                                     for name, value in (("loss", 1.0), ("reward", 0.5)) for step in range(1, 6)])
    errors = watch_for_errors(page)
    log_in(page, live_server.url, team.viewer.username)
    page.goto(f"{live_server.url}/p/chartsrun/runs/{run.public_id}/")
    charts = charts_drawn(page, "#charts .plot")
    assert [chart["asked"] for chart in charts] == [{"scatter": 1}, {"scatter": 1}]
    assert only_drawn(charts) == [chart["asked"] for chart in charts]
    assert errors == []


def test_the_compare_page_draws_its_line_charts_and_the_hyperparameters(page, live_server, monkeypatch):
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    team = make_team(slug="chartscompare")
    model = make_base_model(team.project)
    data = make_ready_version(team.project)
    runs = []
    for rate, loss in ((1e-4, 2.0), (3e-4, 1.5), (1e-3, 1.0)):
        spec = {"task": "sft", "model": model.public_id, "data": {"train": data.public_id},
                "optim": {"learning_rate": rate}, "train": {"max_steps": 5}}
        run = services.run_create(project=team.project, spec=spec, user=team.owner, name=f"lr {rate:g}")
        run.final_metrics = {"loss": {"last": loss, "min": loss, "max": 4.0}}
        run.save(update_fields=["final_metrics"])
        MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=loss * 2 / step,
                                                     wall_time=float(step), tokens=step * 10) for step in range(1, 6)])
        runs.append(run)
    errors = watch_for_errors(page)
    log_in(page, live_server.url, team.viewer.username)
    page.goto(f"{live_server.url}/p/chartscompare/runs/compare/?" + "&".join(f"runs={run.public_id}" for run in runs))
    charts = charts_drawn(page, "#compare-charts .plot")
    assert [chart["asked"] for chart in charts] == [{"scatter": 3}]
    assert only_drawn(charts) == [{"scatter": 3}]
    scroll_to_the_hyperparameters(page)
    [hyperparameters] = charts_drawn(page, "#hyperparameters-plot")
    assert hyperparameters["asked"] == {"parcoords": 1} and only_drawn([hyperparameters]) == [{"parcoords": 1}]
    assert hyperparameters["canvases"] > 0  # its lines are drawn on WebGL canvases
    assert errors == []


def test_a_dataset_versions_page_draws_its_length_and_token_histograms(page, live_server):
    team = make_team(slug="chartsdata")
    version = make_ready_version(team.project)
    DatasetVersion.objects.filter(pk=version.pk).update(
        statistics=histogram_statistics("completion", "prompt"),
        token_statistics={"status": "ready", "base_model": "tiny", "rows": 8, "sampled": False,
                          **histogram_statistics("completion")})
    errors = watch_for_errors(page)
    log_in(page, live_server.url, team.viewer.username)
    page.goto(f"{live_server.url}/p/chartsdata/datasets/{version.dataset.public_id}/v/{version.number}/")
    charts = charts_drawn(page, ".plot[data-chart-source]")
    assert [chart["asked"] for chart in charts] == [{"bar": 1}] * 3
    assert only_drawn(charts) == [{"bar": 1}] * 3
    assert errors == []


# Chart widths from a phone's to a wide window's, in pixels.
CHART_WIDTHS = list(range(240, 1441, 40))

X_TICK_COUNTS = """widths => widths.map(width => {
    const plot = document.createElement("div");
    plot.style.width = width + "px";
    document.body.appendChild(plot);
    const count = window.TemperPlotAxis.xAxis("step", [{x: [1, 2, 3, 40]}], plot).nticks;
    plot.remove();
    return count;
})"""


def test_the_x_axis_asks_plotly_for_a_whole_number_of_ticks(page, live_server, tmp_path):
    """static/plot_axis.js's tick count (xTickCount) was plotly's own count as plotly works it out, a fraction (7.65
    ticks for a chart 600 pixels wide) wherever the numbers fit more: plotly takes nticks as a whole number and drops
    any other for its default, so the count asked was not the one drawn. Every width asks for a whole number of at
    least 2, and the drawn chart keeps the count asked."""
    team = make_team(slug="chartticks")
    run = Run.objects.create(project=team.project, name="ticks", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner,
                             total_steps=40, current_step=40)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=1.0 / step,
                                                 wall_time=float(step), tokens=step * 10) for step in range(1, 41)])
    log_in(page, live_server.url, team.viewer.username)
    page.goto(f"{live_server.url}/p/chartticks/runs/{run.public_id}/")
    charts_drawn(page, "#charts .plot")
    counts = page.evaluate(X_TICK_COUNTS, CHART_WIDTHS)
    assert [count for count in counts if not (isinstance(count, int) and count >= 2)] == []
    assert counts[CHART_WIDTHS.index(600)] == 7  # plotly's own for 600 pixels (7.65), whole
    asked, drawn = page.evaluate("() => { const plot = document.querySelector('#charts .plot');"
                                 " return [plot.layout.xaxis.nticks, plot._fullLayout.xaxis.nticks]; }")
    assert isinstance(asked, int) and asked >= 2 and drawn == asked
