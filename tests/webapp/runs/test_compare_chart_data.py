"""The compare page's chart data: each run's series with their x (step, tokens, time) sent once for all the series
that share them (selectors.series_with_shared_x), against values worked out by hand, and the page that sends it."""
import json

from webapp.runs import selectors, services
from webapp.runs.models import MetricPoint, Run
from tests.webapp.runs.conftest import compare_chart_data, drawn_series, sft_spec


def entry(steps, values, *, downsampled=False):
    return {"step": steps, "value": values, "tokens": [10 * step for step in steps],
            "time": [float(step - 1) for step in steps], "downsampled": downsampled}


def test_series_logged_at_the_same_points_share_one_x_and_others_get_their_own():
    series = {"loss": entry([1, 2, 3, 4], [4.0, 3.0, 9.0, 1.0]),
              "eval/loss": entry([2, 4], [3.5, 2.5]),
              "grad_norm": entry([1, 2, 3, 4], [0.5, 0.25, 0.125, 0.0625])}
    values, xs = selectors.series_with_shared_x(series)
    assert values == {"loss": {"value": [4.0, 3.0, 9.0, 1.0], "x": 0, "downsampled": False},
                      "eval/loss": {"value": [3.5, 2.5], "x": 1, "downsampled": False},
                      "grad_norm": {"value": [0.5, 0.25, 0.125, 0.0625], "x": 0, "downsampled": False}}
    assert xs == [{"step": [1, 2, 3, 4], "tokens": [10, 20, 30, 40], "time": [0.0, 1.0, 2.0, 3.0]},
                  {"step": [2, 4], "tokens": [20, 40], "time": [1.0, 3.0]}]


def test_series_at_the_same_steps_but_other_tokens_or_times_keep_their_own_x():
    """An evaluation logged at a step's end has that step but a later time: it is drawn at its own time."""
    train = entry([1, 2], [1.0, 2.0])
    later = {**entry([1, 2], [5.0, 6.0]), "time": [0.5, 1.5]}
    more_tokens = {**entry([1, 2], [7.0, 8.0], downsampled=True), "tokens": [11, 21]}
    values, xs = selectors.series_with_shared_x({"loss": train, "eval/loss": later, "kl": more_tokens})
    assert [values[name]["x"] for name in ("loss", "eval/loss", "kl")] == [0, 1, 2]
    assert values["kl"]["downsampled"] is True
    assert [x["time"] for x in xs] == [[0.0, 1.0], [0.5, 1.5], [0.0, 1.0]]
    assert [x["tokens"] for x in xs] == [[10, 20], [10, 20], [11, 21]]


def test_a_run_without_series_sends_nothing():
    assert selectors.series_with_shared_x({}) == ({}, [])


def test_the_compare_page_sends_each_runs_steps_tokens_and_times_once_for_the_series_that_share_them(
        team, catalog, client_for, sent_tasks):
    """Page speed: at eight runs the page's chart data was 1.9 MB, three quarters of it the same steps, tokens and
    times again for every metric logged at each step. Each distinct x is sent once a run; every series is drawn at
    the points it was before."""
    runs = []
    for index in range(2):
        run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name=f"run {index}")
        MetricPoint.objects.bulk_create([
            MetricPoint(run=run, step=step, name=name, value=(step * 7 + index) % 5 / 3, wall_time=100.0 + step,
                        tokens=64 * step)
            for name in ("loss", "grad_norm", "learning_rate", "eval/loss") for step in range(1, 41)
            if name != "eval/loss" or step % 10 == 0])
        runs.append(run)
    response = client_for(team.viewer).get("/p/alpha/runs/compare/?" + "&".join(f"runs={run.public_id}" for run in runs))
    assert response.status_code == 200
    data = compare_chart_data(response.content.decode())
    for run in runs:
        # In the order of the series' names (eval/loss first).
        assert [x["step"] for x in data["x"][run.public_id]] == [[10, 20, 30, 40], list(range(1, 41))]
        assert {name: sent["x"] for name, sent in data["series"][run.public_id].items()} == {
            "eval/loss": 0, "grad_norm": 1, "learning_rate": 1, "loss": 1}
        alone = selectors.metric_series(run=Run.objects.get(pk=run.pk), max_points=selectors.COMPARE_MAX_POINTS)
        assert drawn_series(data, run.public_id) == json.loads(json.dumps(alone)), run.name
