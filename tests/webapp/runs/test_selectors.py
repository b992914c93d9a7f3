"""Run selectors: server-side downsampling of long series, the config diff and side-by-side rows."""
import pytest
from django.db import connection
from django.db.models import Q

from webapp.runs import selectors, services
from webapp.runs.downsampling import SeriesBuckets
from webapp.runs.models import MetricPoint, Run, Sample
from tests.webapp.runs.conftest import drawn_series, sft_spec


def make_run(team, catalog, **spec_overrides) -> Run:
    return services.run_create(project=team.project, spec=sft_spec(catalog, **spec_overrides), user=team.owner)


def test_short_series_come_back_whole(team, catalog, sent_tasks):
    run = make_run(team, catalog)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=float(step), wall_time=10.0 + 2 * step,
                                                 tokens=step) for step in range(1, 11)])
    series = selectors.metric_series(run=run)["loss"]
    assert series["step"] == list(range(1, 11)) and not series["downsampled"]
    assert series["time"][:3] == [0.0, 2.0, 4.0]  # seconds since the run's first point


def test_long_series_keep_each_buckets_min_and_max(team, catalog, sent_tasks):
    run = make_run(team, catalog)
    values = {step: 1.0 for step in range(1, 10_001)}
    values[5_000], values[7_777] = 50.0, -3.0  # a spike and a dip that must survive
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=value, wall_time=float(step),
                                                 tokens=step) for step, value in values.items()], batch_size=5000)
    Run.objects.filter(pk=run.pk).update(current_step=10_000)
    run.refresh_from_db()
    series = selectors.metric_series(run=run, max_points=200)["loss"]
    assert series["downsampled"] and len(series["step"]) <= 200
    assert max(series["value"]) == 50.0 and min(series["value"]) == -3.0
    assert series["step"] == sorted(series["step"]) and series["step"][0] == 1 and series["step"][-1] == 10_000
    # 79 buckets of 128 steps (the smallest power of two giving at most 100), each drawn as its low and
    # its high at the steps they were logged: the spike at step 5,000 after its bucket's first 1.0 (step
    # 4,993, the earliest of the tied lows), the dip at 7,777 before its bucket's last 1.0 (7,808, the
    # latest of the tied highs).
    spike, dip = series["value"].index(50.0), series["value"].index(-3.0)
    assert len(series["step"]) == 2 * 79
    assert (series["step"][spike - 1], series["step"][spike]) == (4_993, 5_000)
    assert (series["step"][dip], series["step"][dip + 1], series["value"][dip + 1]) == (7_777, 7_808, 1.0)


def test_a_falling_series_falls_within_each_bucket_too(team, catalog, sent_tasks):
    """The low and the high of a bucket are drawn where they were logged: a falling loss reduced to one
    bucket is its first (highest) point, then its last (lowest), not the other way round."""
    run = make_run(team, catalog)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=12.0 - step / 40,
                                                 wall_time=float(step), tokens=step) for step in range(1, 401)])
    Run.objects.filter(pk=run.pk).update(current_step=400)
    run.refresh_from_db()
    for max_points in (2, 100):  # the database's reduction (one bucket; then 50 of 8 steps)
        series = selectors.metric_series(run=run, max_points=max_points)["loss"]
        assert series["downsampled"] and series["value"] == sorted(series["value"], reverse=True), max_points
        assert (series["step"][0], series["value"][0]) == (1, 12.0 - 1 / 40)
        assert (series["step"][-1], series["value"][-1]) == (400, 2.0)
    # The worker's running buckets (SeriesBuckets.add, stored on the run) give the same points.
    stored = SeriesBuckets(width=8)
    for step in range(1, 401):
        stored.add("loss", step, 12.0 - step / 40, step, float(step))
    assert list(stored.points()) == list(selectors._grouped_buckets({run.pk: Q(run=run)},
                                                                    widths={run.pk: 8})[run.pk].points())


def test_a_downsampled_line_ends_at_the_value_last_logged(team, catalog, sent_tasks):
    """A downsampled series drew each bucket's low and high only: a loss whose last value lay between its bucket's
    extremes ended up to a bucket before the last step, at one of them, and the chart's end and its hover said so.
    The last point of each metric (the step ``final_metrics`` names) is drawn after its bucket's extremes, in each
    reduction (the database's, the stored buckets', a part of the run), and only where the line ended before it."""
    run = make_run(team, catalog)
    # 3 + step % 7 (3..9): every bucket of 8 or more steps (6,000 steps make 8 at the most points) has low 3 and
    # high 9; step 6,000's value, 3 + 1, is neither.
    MetricPoint.objects.bulk_create(
        [MetricPoint(run=run, step=step, name=name, value=3.0 + step % 7 + offset, wall_time=100.0 + step, tokens=4 * step)
         for step in range(1, 6_001) for name, offset in (("loss", 0.0), ("lr", 0.0))]
        + [MetricPoint(run=run, step=step, name="eval_loss", value=step / 1000, wall_time=100.5 + step, tokens=4 * step)
           for step in range(100, 6_001, 100)], batch_size=5000)
    final = {"loss": {"last": 4.0, "min": 3.0, "max": 9.0, "step": 6_000},
             "eval_loss": {"last": 6.0, "min": 0.1, "max": 6.0, "step": 6_000}}
    Run.objects.filter(pk=run.pk).update(current_step=6_000, final_metrics=final)  # "lr" has none: as before
    run.refresh_from_db()
    for max_points in (200, 1_000, selectors.MAX_POINTS):
        series = selectors.metric_series(run=run, max_points=max_points)
        loss = series["loss"]
        assert loss["downsampled"] and loss["value"][-1] == 4.0, max_points
        assert (loss["step"][-1], loss["tokens"][-1], loss["time"][-1]) == (6_000, 24_000, 5_999.0)
        assert loss["step"][-2] < 6_000 and loss["value"][-3:-1] in ([3.0, 9.0], [9.0, 3.0])  # its bucket, then it
        assert series["lr"]["step"][-1] < 6_000  # no final_metrics entry: its line as reduced
        assert series["eval_loss"]["step"][-1] == 6_000 and series["eval_loss"]["step"].count(6_000) == 1
    stored = selectors.series_buckets(run=run)
    Run.objects.filter(pk=run.pk).update(series_cache={"buckets": stored.to_json()})
    run.refresh_from_db()
    assert selectors.metric_series(run=run, max_points=200)["loss"]["value"][-1] == 4.0  # from the stored buckets
    part = selectors.metric_series(run=run, names=["loss"], after_step=100, max_points=200)["loss"]
    assert (part["step"][-1], part["value"][-1]) == (6_000, 4.0)


def test_config_diff_marks_what_differs(team, catalog, sent_tasks):
    first = make_run(team, catalog)
    second = make_run(team, catalog, optim={"learning_rate": 0.01}, peft={"method": "lora", "targets": ["q_proj"]})
    rows = {row["key"]: row for row in selectors.config_diff(runs=[first, second])}
    assert rows["optim.learning_rate"]["differs"] and rows["optim.learning_rate"]["values"] == [0.0001, 0.01]
    assert rows["peft.targets"]["values"][1] == '["q_proj"]'
    assert rows["data.packing"]["values"] == ["false", "false"]  # as the spec writes it, not Python's False
    assert not rows["train.max_steps"]["differs"]


def test_side_by_side_rows_are_prompts_and_columns_runs(team, catalog, sent_tasks):
    first, second = make_run(team, catalog), make_run(team, catalog)
    for run, steps in ((first, (5, 10)), (second, (5,))):
        for step in steps:
            Sample.objects.bulk_create([Sample(run=run, step=step, position=index, prompt=prompt,
                                               text=f"{run.pk}-{step}-{index}")
                                        for index, prompt in enumerate(["a", "b"])])
    table = selectors.side_by_side(runs=[first, second])
    assert [column["step"] for column in table["columns"]] == [10, 5]  # each run's last sampled step
    assert [row["prompt"] for row in table["rows"]] == ["a", "b"]
    assert [cell.text for cell in table["rows"][1]["cells"]] == [f"{first.pk}-10-1", f"{second.pk}-5-1"]


def test_side_by_side_gives_each_prompt_its_reference(team, catalog, sent_tasks, client_for):
    """QA (comparing a sweep's generations): the compare page put each run's answer to a prompt side by side
    without the answer it should have been, which the run page's samples show: which run got it right could not
    be read. A row has its prompt's reference (an answer, an SFT completion, a chosen answer), escaped."""
    first, second, third = make_run(team, catalog), make_run(team, catalog), make_run(team, catalog)
    Sample.objects.bulk_create([
        Sample(run=first, step=10, position=0, prompt="What is 2+2?", text="5", answer="4"),
        Sample(run=first, step=10, position=1, prompt="Say <b>hi</b>", text="hi", extra={"completion": "<b>hi</b>"}),
        Sample(run=second, step=10, position=0, prompt="What is 2+2?", text="4", answer="4"),
        Sample(run=second, step=10, position=1, prompt="Say <b>hi</b>", text="hello", extra={"completion": "<b>hi</b>"}),
        Sample(run=second, step=10, position=2, prompt="Which?", text="A", extra={"chosen": "B"}),
        Sample(run=third, step=10, position=0, prompt="no reference", text="x")])
    table = selectors.side_by_side(runs=[first, second])
    assert [(row["prompt"], row["reference"]) for row in table["rows"]] == [
        ("What is 2+2?", "4"), ("Say <b>hi</b>", "<b>hi</b>"), ("Which?", "B")]
    assert table["has_reference"] and not selectors.side_by_side(runs=[third, first])["rows"][0]["reference"]
    page = client_for(team.viewer).get(f"/p/alpha/runs/compare/?runs={first.public_id}&runs={second.public_id}")
    html = page.content.decode()
    assert "<th>Reference</th>" in html and '<td class="generation reference">&lt;b&gt;hi&lt;/b&gt;</td>' in html


def test_side_by_side_shows_each_run_at_the_step_picked_and_marks_its_exact_matches(team, catalog, sent_tasks,
                                                                                  client_for):
    """QA (a W&B user reading a sweep's generations): each run was shown at its last evaluated step, with no way to
    read an earlier one, and which answer was right was left to the eye. A column is shown at the step picked
    (``gen=<run id>:<step>``; a step not evaluated: the nearest), offers every step the run evaluated, and a run
    that scores eval/exact_match marks each generation matching the reference by the engine's own rule."""
    first, second = make_run(team, catalog), make_run(team, catalog)
    Run.objects.filter(pk=first.pk).update(final_metrics={"eval/exact_match": {"last": 0.5, "min": 0.0, "max": 0.5}})
    first.refresh_from_db()
    for run in (first, second):
        Sample.objects.bulk_create([Sample(run=run, step=step, position=0, prompt="How many?", text=text, answer="1000")
                                    for step, text in ((10, "ten"), (20, " 1,000 "), (30, "1000!"))])
    table = selectors.side_by_side(runs=[first, second], steps={first.pk: 21})
    assert [(column["step"], column["steps"]) for column in table["columns"]] == [(20, [10, 20, 30]), (30, [10, 20, 30])]
    first_cell, second_cell = table["rows"][0]["cells"]
    assert (first_cell.text, first_cell.matches_answer) == (" 1,000 ", True)  # numbers and spaces as the engine reads
    assert (second_cell.text, second_cell.matches_answer) == ("1000!", None)  # the second run scores no exact match
    client = client_for(team.viewer)
    compare = f"/p/alpha/runs/compare/?runs={first.public_id}&runs={second.public_id}"
    html = client.get(compare + f"&gen={first.public_id}:10").content.decode()
    assert '<option value="10" selected>step 10</option>' in html and 'class="exact-match miss"' in html
    html = client.get(compare + f"&gen={first.public_id}:20").content.decode()
    assert 'class="exact-match match"' in html
    # What the address asks that is no run's step is said, and each run is shown at its last step.
    html = client.get(compare + "&gen=nobody:ten").content.decode()
    assert "gen=nobody:ten" in html and "each is &lt;run id&gt;:&lt;step&gt;" in html
    assert '<option value="30" selected>step 30 (last)</option>' in html


def test_a_metric_is_better_lower_for_losses_higher_for_rewards_and_accuracies_and_neither_otherwise():
    better = {name: selectors.metric_higher_is_better(name) for name in (
        "loss", "eval/loss/math", "reward", "rewards/format_regex", "eval/exact_match/arithmetic", "rewards/accuracies",
        "preference accuracy", "reward margin", "reward_std", "kl", "learning_rate", "frac_reward_zero_std")}
    assert better == {"loss": False, "eval/loss/math": False, "reward": True, "rewards/format_regex": True,
                      "eval/exact_match/arithmetic": True, "rewards/accuracies": True, "preference accuracy": True,
                      "reward margin": True, "reward_std": None, "kl": None, "learning_rate": None,
                      "frac_reward_zero_std": None}
    # The runs table's own sorts go best first by the same rule.
    assert not selectors.SORTS["loss"].descending and selectors.SORTS["reward"].descending


def test_a_finished_runs_series_are_read_from_its_cache(team, catalog, sent_tasks, monkeypatch):
    run = make_run(team, catalog)
    MetricPoint.objects.create(run=run, step=1, name="loss", value=2.0, wall_time=1.0, tokens=1)
    cache = selectors.series_cache_for(run)
    Run.objects.filter(pk=run.pk).update(status="succeeded", series_cache=cache, current_step=1)
    run.refresh_from_db()
    MetricPoint.objects.all().delete()  # the cache, not the points, answers now
    assert selectors.metric_series(run=run, max_points=selectors.COMPARE_MAX_POINTS)["loss"]["value"] == [2.0]
    assert selectors.metric_series(run=run, max_points=50) == {}  # other resolutions are computed
    monkeypatch.setattr(services, "_clear_cancel_flag", lambda public_id: None)
    resumed = services.run_resume(run=run, user=None, max_steps=20)
    assert resumed.series_cache == {}


def test_generations_across_steps_of_one_run(team, catalog, sent_tasks, client_for):
    run = make_run(team, catalog)
    for step in (10, 20, 30):
        Sample.objects.bulk_create([Sample(run=run, step=step, position=index, prompt=prompt, text=f"{prompt}@{step}")
                                    for index, prompt in enumerate(["<p>", "q"])])
    table = selectors.generations_across_steps(run=run, limit=2)
    assert table["steps"] == [20, 30] and [row["prompt"] for row in table["rows"]] == ["<p>", "q"]
    assert [cell.text for cell in table["rows"][1]["cells"]] == ["q@20", "q@30"]
    page = client_for(team.viewer).get(f"/p/alpha/runs/{run.public_id}/").content.decode()
    assert "<th>step 30</th>" in page and "&lt;p&gt;@20" in page


def _long_run(team, catalog, steps: int) -> Run:
    run = make_run(team, catalog)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name=name, value=(step * 7919 % 1000) / 10 + offset,
                                                 wall_time=50.0 + step, tokens=step * 8)
                                     for step in range(1, steps + 1) for name, offset in (("loss", 0.0), ("kl", 1.0))],
                                    batch_size=5000)
    Run.objects.filter(pk=run.pk).update(status="running", current_step=steps)
    run.refresh_from_db()
    return run


def test_a_running_runs_stored_buckets_plus_the_points_since_equal_a_full_reduction(team, catalog, sent_tasks):
    run = _long_run(team, catalog, 6_000)
    full = selectors.metric_series(run=run, max_points=selectors.COMPARE_MAX_POINTS)
    # What the train worker stores: the buckets of the first 5,000 steps; steps 5,001-6,000 are the tail.
    stored = selectors._grouped_buckets({run.pk: Q(run=run, step__lte=5_000)}, widths={run.pk: 8})[run.pk]
    stored.through_step = 5_000
    Run.objects.filter(pk=run.pk).update(series_cache={"buckets": stored.to_json()})
    run.refresh_from_db()
    assert selectors.metric_series(run=run, max_points=selectors.COMPARE_MAX_POINTS) == full
    # The run page's resolution (2,000 points: width 8 for 6,000 steps) comes from the same buckets.
    page = selectors.metric_series(run=run)
    assert page["loss"]["downsampled"] and len(page["loss"]["step"]) == 2 * 750


def test_a_running_runs_stored_buckets_answer_for_the_steps_they_cover(team, catalog, sent_tasks):
    run = _long_run(team, catalog, 4_000)
    stored = selectors.series_buckets(run=run)
    stored.buckets["loss"][0][2] = -99.0  # a marker: only the stored buckets hold it
    Run.objects.filter(pk=run.pk).update(series_cache={"buckets": stored.to_json()})
    run.refresh_from_db()
    MetricPoint.objects.filter(run=run, step__lte=stored.through_step).delete()
    series = selectors.metric_series(run=run, max_points=selectors.COMPARE_MAX_POINTS)
    assert -99.0 in series["loss"]["value"][:2] and series["loss"]["step"][-1] == 4_000  # the first bucket's two


def _rollouts(run, step, rewards):
    return [Sample(run=run, step=step, position=index, prompt="p", text=f"r{step}.{index}", reward=reward,
                   rewards={"exact_match": reward}, extra={"kind": "rollout", "advantage": reward - 0.5})
            for index, reward in enumerate(rewards)]


def test_rollouts_are_filtered_by_kind_and_ordered_by_reward_and_kept_out_of_side_by_side(team, catalog, sent_tasks):
    run = make_run(team, catalog)
    Sample.objects.bulk_create(_rollouts(run, 1, [0.0, 1.0, 0.5]) + _rollouts(run, 2, [1.0]) + [
        Sample(run=run, step=1, position=3, prompt="q", text="greedy at 1"),
        Sample(run=run, step=1, position=4, prompt="q2", text="greedy kind eval", extra={"kind": "eval"})])
    assert selectors.sample_steps(run=run) == [1, 2] and selectors.sample_steps(run=run, kind="eval") == [1]
    assert [s.text for s in selectors.sample_list(run=run, step=1, kind="rollout", order="reward")] == [
        "r1.1", "r1.2", "r1.0"]
    assert [s.text for s in selectors.sample_list(run=run, step=1, kind="eval")] == ["greedy at 1", "greedy kind eval"]
    assert [s.text for s in selectors.sample_list(run=run, kind="rollout", min_reward=0.75)] == ["r1.1", "r2.0"]
    table = selectors.side_by_side(runs=[run])
    assert table["columns"][0]["step"] == 1 and [row["prompt"] for row in table["rows"]] == ["q", "q2"]


def test_series_without_stored_buckets_take_one_query_however_many_points_they_hold(team, catalog, sent_tasks):
    """Page speed: the series of runs without stored buckets (finished before buckets were kept, logged from
    elsewhere) came from one grouped query, then a query per 900 of the buckets' extreme values for the points
    they were logged at, so the compare page's queries followed the points (81 for ten runs of 100,000). Each
    bucket comes with its extremes' points now: one query for 3,600 points as for 18,000, each series as the
    worker's own reduction of every point (``SeriesBuckets.add``) draws it, ties included."""
    from django.test.utils import CaptureQueriesContext

    def runs_of(steps: int) -> list[Run]:
        runs = []
        for status in ("succeeded", "running"):
            run = make_run(team, catalog)
            # Distinct values (7919 is prime to 10007), so every bucket has two extremes to find; "lr" is one
            # value throughout: its low is drawn at each bucket's first step, its high at its last.
            MetricPoint.objects.bulk_create(
                [MetricPoint(run=run, step=step, name=name, value=value, wall_time=1e9 + step + offset, tokens=8 * step)
                 for step in range(1, steps + 1)
                 for name, value, offset in (("loss", step * 7919 % 10007 / 10007, 0.0),
                                             ("reward", 1 - step * 7919 % 10007 / 10007, 0.5), ("lr", 1e-3, 0.25))],
                batch_size=5000)
            Run.objects.filter(pk=run.pk).update(status=status, current_step=steps, series_cache={})
            runs.append(Run.objects.get(pk=run.pk))
        return runs

    def worker_series(run: Run, steps: int) -> dict:
        reduced = SeriesBuckets(width=1)
        for name, step, value, tokens, wall_time in MetricPoint.objects.filter(run=run).values_list(
                "name", "step", "value", "tokens", "wall_time"):
            reduced.add(name, step, value, tokens, wall_time)
        width = selectors.bucket_width(steps, selectors.COMPARE_MAX_POINTS)
        return selectors._series(list(reduced.coarsened(width).points()), downsampled=True,
                                 start_time=reduced.start_time())

    counts = {}
    for steps in (1_200, 6_000):
        runs = runs_of(steps)
        with CaptureQueriesContext(connection) as queries:
            series = selectors.runs_metric_series(runs=runs, max_points=selectors.COMPARE_MAX_POINTS)
        counts[steps] = len(queries)
        for run in runs:
            assert series[run.pk] == worker_series(run, steps), (steps, run.status)
            assert series[run.pk]["loss"]["downsampled"] and len(series[run.pk]["loss"]["step"]) > 500
    assert counts == {1_200: 1, 6_000: 1}, counts


def test_the_final_metrics_of_a_comparison_start_with_what_it_is_read_for():
    """eval/loss sat at the right edge of the compare page's final table, behind the eval/ metrics before it
    by name, off the visible part at 1400 px."""
    names = ["grad_norm", "eval/accuracy", "eval/loss", "learning_rate", "loss", "eval/exact_match", "eval/aaa"]
    assert selectors.final_order(names) == ["loss", "eval/loss", "eval/exact_match", "eval/accuracy", "grad_norm",
                                            "learning_rate", "eval/aaa"]


def test_the_runs_table_sorts_by_final_loss_eval_loss_reward_and_duration(team, catalog, sent_tasks):
    """Runs can be ordered by what they reached, not only by when they started; runs that have not
    logged the metric come after the rest either way."""
    finals = {"a": ({"loss": {"last": 0.9}, "eval/loss": {"last": 1.4}}, 30.0),
              "b": ({"loss": {"last": 0.25}, "reward": {"last": -0.5}}, 300.0),
              "c": ({"reward": {"last": 0.75}, "eval/loss": {"last": 1.1}}, 5.0),
              "d": ({}, 0.0)}
    for name, (final_metrics, seconds) in finals.items():
        run = make_run(team, catalog)
        Run.objects.filter(pk=run.pk).update(name=name, final_metrics=final_metrics, train_seconds=seconds)

    def order(sort):
        return [run.name for run in selectors.run_list(project=team.project, filters=selectors.RunFilters(sort=sort))]

    # Ties (no value) keep the table's second order, the newest first.
    assert order("loss") == ["b", "a", "d", "c"]
    assert order("eval_loss") == ["c", "a", "d", "b"]
    assert order("reward") == ["c", "b", "d", "a"]
    assert order("duration") == ["b", "a", "c", "d"]
    assert set(selectors.SORT_LABELS) == set(selectors.SORTS)


def test_config_diff_names_the_models_runs_and_dataset_versions_a_spec_points_at(team, catalog, sent_tasks):
    """QA: the diff's model and data rows read bm_…, dv_…: which dataset was which took a trip to each run."""
    first = make_run(team, catalog)
    second = make_run(team, catalog, data={"train": catalog.sft.public_id, "eval": catalog.sft.public_id})
    Run.objects.filter(pk=first.pk).update(name="first run")
    third_spec = {**second.spec, "model": f"{first.public_id}@12"}
    Run.objects.filter(pk=second.pk).update(spec=third_spec)
    second.refresh_from_db()
    first.refresh_from_db()
    rows = {row["key"]: row for row in selectors.config_diff(runs=[first, second])}
    model_values = rows["model"]["values"]
    assert model_values[0] == selectors.SpecReference(name=catalog.base_model.name, ref=catalog.base_model.public_id)
    assert model_values[1] == selectors.SpecReference(name="first run, checkpoint 12", ref=f"{first.public_id}@12")
    assert rows["data.train"]["values"][0].name == f"{catalog.sft.dataset.name} v{catalog.sft.number}"
    assert rows["data.eval"]["values"] == [None, rows["data.train"]["values"][0]] and rows["data.eval"]["differs"]
    assert rows["model"]["differs"] and not rows["data.train"]["differs"]
    assert rows["train.max_steps"]["values"] == [10, 10]  # other values as they were


def test_config_diff_leaves_ids_of_other_projects_and_lookalike_text_as_written(team, catalog, sent_tasks):
    from tests.webapp.factories import make_base_model, make_team

    other = make_team(slug="other-diff")
    outsider_model = make_base_model(other.project)
    first = make_run(team, catalog)
    second = make_run(team, catalog)
    Run.objects.filter(pk=second.pk).update(spec={**second.spec, "model": outsider_model.public_id, "note": "bm_"})
    second.refresh_from_db()
    rows = {row["key"]: row for row in selectors.config_diff(runs=[first, second])}
    assert rows["model"]["values"][1] == outsider_model.public_id  # not named: another project's
    assert rows["note"]["values"] == [None, "bm_"]


def test_config_diff_says_what_a_spec_points_at_was_deleted_since(team, catalog, sent_tasks):
    """QA: a pipeline's dpo stage, compared once the sft stage's run was deleted, read model: run_… beside
    the other runs' named models, with nothing to say that the run is gone (its page's lineage says so)."""
    first = make_run(team, catalog)
    second = make_run(team, catalog)
    Run.objects.filter(pk=second.pk).update(spec={**second.spec, "model": "run_gone0000000000"}, base_model=None)
    second.refresh_from_db()
    rows = {row["key"]: row for row in selectors.config_diff(runs=[first, second])}
    assert rows["model"]["values"][1] == selectors.SpecReference(name="deleted since", ref="run_gone0000000000")
    assert rows["model"]["values"][0].name == catalog.base_model.name


def test_points_logged_at_step_0_come_back(team, catalog, sent_tasks):
    """An external run's evaluation before training, logged at step 0, was never charted: series were
    read 'after step 0'."""
    run = services.run_create_external(project=team.project, name="ext", config={}, user=team.owner)
    services.metrics_log(run=run, points=[{"step": 0, "metrics": {"eval/loss": 3.0}},
                                          {"step": 1, "metrics": {"eval/loss": 2.0, "loss": 2.5}}])
    series = selectors.metric_series(run=run)
    assert series["eval/loss"]["step"] == [0, 1] and series["eval/loss"]["value"] == [3.0, 2.0]
    assert selectors.metric_series(run=run, after_step=0)["eval/loss"]["step"] == [1]
    assert selectors.metric_series(run=run, names=["eval/loss"], max_points=2)["eval/loss"]["value"] == [3.0, 2.0]
    services.metrics_log(run=run, points=[{"step": step, "metrics": {"eval/loss": 1.0}} for step in range(2, 41)])
    reduced = selectors.metric_series(run=run, names=["eval/loss"], max_points=8)["eval/loss"]
    assert reduced["downsampled"] and reduced["step"][0] == 0 and reduced["value"][0] == 3.0  # in the first bucket


def test_hyperparameter_axes_are_the_differing_single_values_with_each_runs_last_metrics(team, catalog, sent_tasks):
    runs = [make_run(team, catalog, optim={"learning_rate": rate, "schedule": schedule},
                     peft={"method": "lora", "targets": targets})
            for rate, schedule, targets in ((1e-4, "cosine", ["q_proj"]), (1e-3, "linear", ["q_proj", "v_proj"]),
                                            (3e-3, "cosine", ["q_proj"]))]
    runs[2].spec = {**runs[2].spec, "data": {**runs[2].spec["data"], "eval": catalog.sft.public_id}}
    for run, loss in zip(runs, (2.0, 1.5, None)):
        run.final_metrics = {"reward": {"last": 0.5, "min": 0.0, "max": 0.5}} | (
            {"loss": {"last": loss, "min": loss, "max": 3.0}} if loss is not None else {})
    diff = selectors.config_diff(runs=runs)
    drawn = selectors.hyperparameter_axes(runs=runs, diff=diff, metric_names=["loss", "eval/loss", "reward"])
    assert drawn["runs"] == [run.name for run in runs]
    # peft.targets (a list) has no axis; the evaluation data is a category named as the diff names it.
    assert [(axis["key"], axis["numeric"]) for axis in drawn["axes"]] == [
        ("data.eval", False), ("optim.learning_rate", True), ("optim.schedule", False)]
    assert drawn["axes"][0]["values"] == ["—", "—", f"{catalog.sft.dataset.name} v{catalog.sft.number}"]
    assert drawn["axes"][1]["values"] == [1e-4, 1e-3, 3e-3]
    assert drawn["metrics"] == {"loss": [2.0, 1.5, None], "reward": [0.5, 0.5, 0.5]}  # no run has eval/loss
    # Two runs (a plain comparison), or no differing key to draw: no chart.
    assert selectors.hyperparameter_axes(runs=runs[:2], diff=selectors.config_diff(runs=runs[:2]),
                                         metric_names=["loss"]) is None
    same = [make_run(team, catalog) for _ in range(3)]
    assert selectors.hyperparameter_axes(runs=same, diff=selectors.config_diff(runs=same), metric_names=["loss"]) is None


def test_each_drawn_extreme_carries_its_own_tokens_and_time(team, catalog, sent_tasks):
    """A tokens or time x-axis draws each bucket's low and high at the tokens and wall time of their own
    points, not the bucket's first ones: the database's reduction and the worker's agree on them."""
    run = make_run(team, catalog)
    # Steps 1-8 in one bucket (max_points=2); the low 1.0 at step 4, the high 9.0 at step 5.
    values = {1: 5.0, 2: 4.0, 3: 3.0, 4: 1.0, 5: 9.0, 6: 2.0, 7: 2.0, 8: 2.0}
    tokens = {1: 100, 2: 212, 3: 500, 4: 839, 5: 1046, 6: 1200, 7: 1300, 8: 1400}
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=value,
                                                 wall_time=1000.0 + 3 * step, tokens=tokens[step])
                                     for step, value in values.items()])
    Run.objects.filter(pk=run.pk).update(current_step=8)
    run.refresh_from_db()
    series = selectors.metric_series(run=run, max_points=2)["loss"]
    # Times count from the run's first point (1003.0), which is neither extreme.
    assert series == {"step": [4, 5], "value": [1.0, 9.0], "tokens": [839, 1046], "time": [9.0, 12.0],
                      "downsampled": True}
    part = selectors.metric_series(run=run, names=["loss"], after_step=2, max_points=2)["loss"]
    assert (part["step"], part["tokens"], part["time"]) == ([4, 5], [839, 1046], [9.0, 12.0])
    worker = SeriesBuckets(width=8)
    for step, value in values.items():
        worker.add("loss", step, value, tokens[step], 1000.0 + 3 * step)
    assert list(worker.points()) == [("loss", 4, 1.0, 839, 1012.0), ("loss", 5, 9.0, 1046, 1015.0)]
    assert worker.buckets == selectors._grouped_buckets({run.pk: Q(run=run)}, widths={run.pk: 8})[run.pk].buckets


def test_charts_lead_with_what_each_kind_of_run_is_read_for():
    """QA: a GRPO or PPO run page drew ~30 charts by name, its reward after completions/*, entropy, epoch,
    grad_norm and memory, its KL further down; a DPO run's accuracies and margins after logps/* and memory.
    Loss comes first, then reward, KL, and preference accuracy and margin; the rest by name, eval/ last."""
    grpo = ["clip_ratio", "completions/mean_length", "entropy", "epoch", "frac_reward_zero_std", "grad_norm", "kl",
            "loss", "memory/host_peak_gib", "reward", "reward_std", "rewards/exact_match/mean", "eval/reward",
            "eval/exact_match"]
    assert selectors.chart_order(grpo)[:3] == ["loss", "reward", "kl"]
    assert selectors.chart_order(grpo)[-2:] == ["eval/reward", "eval/exact_match"]
    ppo = ["loss", "loss/value", "objective/kl", "objective/scores", "policy/clipfrac", "reward", "val/mean"]
    assert selectors.chart_order(ppo)[:3] == ["loss", "reward", "objective/kl"]
    dpo = ["epoch", "grad_norm", "logps/chosen", "logps/rejected", "loss", "memory/host_peak_gib",
           "rewards/accuracies", "rewards/chosen", "rewards/margins", "rewards/rejected", "eval/loss",
           "eval/rewards/accuracies", "eval/rewards/margins", "eval/logps/chosen"]
    assert selectors.chart_order(dpo)[:3] == ["loss", "rewards/accuracies", "rewards/margins"]
    assert selectors.chart_order(dpo)[-4:] == ["eval/loss", "eval/rewards/accuracies", "eval/rewards/margins",
                                               "eval/logps/chosen"]
    reward = ["accuracy", "epoch", "loss", "margin", "rewards/chosen", "eval/accuracy", "eval/loss", "eval/margin"]
    assert selectors.chart_order(reward) == ["loss", "accuracy", "margin", "epoch", "rewards/chosen", "eval/loss",
                                             "eval/accuracy", "eval/margin"]


def test_the_final_metrics_of_a_dpo_comparison_lead_with_its_accuracy_and_margin():
    """QA: comparing DPO runs, rewards/accuracies and rewards/margins (and their eval/ values) sat behind
    epoch, grad_norm, learning_rate, logps/* and memory in the final table, off its visible part."""
    names = ["epoch", "grad_norm", "learning_rate", "logps/chosen", "loss", "memory/host_peak_gib",
             "rewards/accuracies", "rewards/margins", "eval/loss", "eval/rewards/accuracies", "eval/rewards/margins"]
    assert selectors.final_order(names)[:6] == ["loss", "eval/loss", "rewards/accuracies", "eval/rewards/accuracies",
                                                "rewards/margins", "eval/rewards/margins"]


def test_a_finished_runs_cache_of_the_older_bucket_layout_is_read_again_from_its_points(team, catalog, sent_tasks,
                                                                                         client_for):
    """A run that finished before buckets kept each extreme's own tokens and time cached its compare series
    at each bucket's smallest tokens and time: on a tokens or time x-axis its points sat up to a bucket
    early. Such a cache (eight-field buckets, no layout) is not read; the compare page draws the run from
    its points and stores the cache again in the current layout."""
    run = make_run(team, catalog)
    steps = 2 * selectors.COMPARE_MAX_POINTS  # buckets of four steps at the compare page's resolution
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=float(step % 4),
                                                 wall_time=100.0 + step, tokens=10 * step)
                                     for step in range(1, steps + 1)])
    exact = selectors.metric_series(run=run, max_points=selectors.COMPARE_MAX_POINTS)["loss"]
    # What a run finished then stored: each bucket [first, last, low, high, tokens, time, low step, high step]
    # (its high 3.0 at step 4i + 3, its low 0.0 at 4i + 4), drawn at the bucket's smallest tokens and time.
    old_buckets = {"width": 4, "through_step": steps, "through_id": 0,
                   "buckets": {"loss": [[index, 4 * index + 1, 4 * index + 4, 0.0, 3.0, 10 * (4 * index + 1),
                                         101.0 + 4 * index, 4 * index + 4, 4 * index + 3]
                                        for index in range(steps // 4)]}}
    old_series = {"loss": {"step": exact["step"], "value": exact["value"],
                           "tokens": [10 * (4 * (point // 2) + 1) for point in range(steps // 2)],
                           "time": [4.0 * (point // 2) for point in range(steps // 2)], "downsampled": True}}
    Run.objects.filter(pk=run.pk).update(status="succeeded", current_step=steps, series_cache={
        "buckets": old_buckets, "max_points": selectors.COMPARE_MAX_POINTS, "series": old_series})
    run.refresh_from_db()
    assert exact["tokens"][:2] == [30, 40] and old_series["loss"]["tokens"][:2] == [10, 10]
    assert selectors.metric_series(run=run, max_points=selectors.COMPARE_MAX_POINTS)["loss"] == exact

    other = make_run(team, catalog)
    page = client_for(team.viewer).get(f"/p/alpha/runs/compare/?runs={run.public_id}&runs={other.public_id}")
    assert page.status_code == 200
    assert drawn_series(page.context["chart_data"], run.public_id)["loss"] == exact
    run.refresh_from_db()
    assert run.series_cache["series"]["loss"] == exact
    assert run.series_cache["buckets"]["layout"] == SeriesBuckets.LAYOUT
    MetricPoint.objects.filter(run=run).delete()  # the renewed cache answers now, not the points
    assert selectors.metric_series(run=run, max_points=selectors.COMPARE_MAX_POINTS)["loss"] == exact


def test_the_run_page_caches_an_older_layout_finished_runs_series_again(team, catalog, sent_tasks, client_for):
    """The run page, unlike the compare page, left a run finished before the current bucket layout as it was:
    each view reduced all its points again, until the run was opened on the compare page."""
    run = make_run(team, catalog)
    steps = 2 * selectors.MAX_POINTS  # over the run page's resolution: drawn from buckets, not the points
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=float(step % 4),
                                                 wall_time=100.0 + step, tokens=10 * step)
                                     for step in range(1, steps + 1)])
    exact = selectors.metric_series(run=run)["loss"]
    # Eight-field buckets with no layout, as a run finished then stored them.
    old_buckets = {"width": 4, "through_step": steps, "through_id": 0,
                   "buckets": {"loss": [[index, 4 * index + 1, 4 * index + 4, 0.0, 3.0, 10 * (4 * index + 1),
                                         101.0 + 4 * index, 4 * index + 4, 4 * index + 3]
                                        for index in range(steps // 4)]}}
    Run.objects.filter(pk=run.pk).update(status="succeeded", current_step=steps, series_cache={
        "buckets": old_buckets, "max_points": selectors.COMPARE_MAX_POINTS, "series": {}})
    page = client_for(team.viewer).get(f"/p/alpha/runs/{run.public_id}/")
    assert page.status_code == 200 and page.context["series"]["loss"] == exact
    run.refresh_from_db()
    assert selectors.series_cache_current(run=run)
    MetricPoint.objects.filter(run=run).delete()  # the renewed cache answers now, not the points
    assert client_for(team.viewer).get(f"/p/alpha/runs/{run.public_id}/").context["series"]["loss"] == exact


def test_a_reward_model_and_a_dpo_run_share_charts_of_the_quantities_both_log_under_their_own_names(
        team, catalog, sent_tasks):
    """A reward model logs accuracy and margin (and eval/ ones), DPO rewards/accuracies and rewards/margins:
    the same share of pairs ranked right and mean chosen-minus-rejected reward. Compared, each pair is one
    chart; names of one kind alone, or of no kind that logs them (an SFT run's accuracy), stay as they are."""
    reward, dpo, sft = (make_run(team, catalog) for _ in range(3))
    Run.objects.filter(pk=reward.pk).update(task="reward")
    Run.objects.filter(pk=dpo.pk).update(task="dpo")
    for run in (reward, dpo):
        run.refresh_from_db()
    series = {reward.public_id: {"loss": {}, "accuracy": {}, "margin": {}, "eval/accuracy": {}},
              dpo.public_id: {"loss": {}, "rewards/accuracies": {}, "rewards/margins": {}, "logps/chosen": {}},
              sft.public_id: {"loss": {}, "accuracy": {}}}
    assert selectors.shared_charts(runs=[reward, dpo, sft], series=series) == {
        reward.public_id: {"accuracy": "preference accuracy", "margin": "reward margin"},
        dpo.public_id: {"rewards/accuracies": "preference accuracy", "rewards/margins": "reward margin"}}
    # eval/accuracy has no DPO counterpart here: it keeps its own chart.
    series[dpo.public_id]["eval/rewards/accuracies"] = {}
    shared = selectors.shared_charts(runs=[reward, dpo], series=series)
    assert shared[reward.public_id]["eval/accuracy"] == shared[dpo.public_id]["eval/rewards/accuracies"] == (
        "eval/preference accuracy")
    assert selectors.shared_charts(runs=[dpo, make_run(team, catalog)], series=series) == {}


def test_hyperparameter_axes_leave_out_keys_only_one_compared_run_has(team, catalog, sent_tasks):
    """QA: comparing runs of different kinds drew an axis for every key of each kind's own section, each
    "—" for all runs but one, or the same value in each run of that kind: a wall of axes that compare
    nothing. A key is an axis where the runs it applies to differ in it (the task's axis tells kinds apart)."""
    runs = [make_run(team, catalog, optim={"learning_rate": rate}) for rate in (1e-4, 1e-3, 3e-3)]
    runs[0].spec = {**runs[0].spec, "task": "dpo", "dpo": {"beta": 0.1, "loss_type": "sigmoid"}}
    runs[1].spec = {**runs[1].spec, "task": "dpo", "dpo": {"beta": 0.2, "loss_type": "sigmoid"}}
    runs[2].spec = {**runs[2].spec, "task": "reward", "reward": {"center_rewards_coefficient": 0.01}}
    for run in runs:
        run.task = run.spec["task"]
        run.final_metrics = {"loss": {"last": 1.0, "min": 1.0, "max": 2.0}}
    diff = selectors.config_diff(runs=runs)
    drawn = selectors.hyperparameter_axes(runs=runs, diff=diff, metric_names=["loss"])
    assert [axis["key"] for axis in drawn["axes"]] == ["dpo.beta", "optim.learning_rate", "task"]
    assert drawn["axes"][0] == {"key": "dpo.beta", "numeric": False, "values": ["0.1", "0.2", "—"]}


def test_steps_without_learning_signal_are_counted_and_joined_into_ranges(team, catalog, sent_tasks):
    """QA: the run page did not flag steps that could not train (every group's rewards equal,
    frac_reward_zero_std 1, or nothing in the loss, grad_norm 0): their flat loss read as converged. Counted
    from every stored point, not the drawn (downsampled) series."""
    run = make_run(team, catalog)
    assert selectors.no_learning_signal(run=run) == {"ranges": [], "count": 0, "steps": 0, "through": -1}
    grad_norm = {1: 0.5, 2: 0.0, 3: 0.0, 4: 0.7, 5: 0.2, 6: 0.4, 7: 0.0, 8: 0.3}
    zero_std = {1: 0.5, 2: 1.0, 3: 1.0, 4: 0.9, 5: 0.2, 6: 1.0, 7: 0.0, 8: 0.0}
    MetricPoint.objects.bulk_create(
        [MetricPoint(run=run, step=step, name="grad_norm", value=value, wall_time=1.0) for step, value in grad_norm.items()]
        + [MetricPoint(run=run, step=step, name="frac_reward_zero_std", value=value, wall_time=1.0)
           for step, value in zero_std.items()]
        # An evaluation's metrics say nothing of training steps.
        + [MetricPoint(run=run, step=8, name="eval/reward", value=0.0, wall_time=1.0)])
    assert selectors.no_learning_signal(run=run) == {"ranges": [[2, 3], [6, 7]], "count": 4, "steps": 8, "through": 8}



# The suite runs again on PostgreSQL (tests/postgres/test_webapp_suite_postgres.py), whose driver has no progress
# handler; there tests/postgres/test_runs_postgres.py checks the same two reads by their EXPLAIN plans.
counts_sqlite_instructions = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="counts the SQLite virtual machine's instructions; on PostgreSQL "
    "tests/postgres/test_runs_postgres.py checks these reads' query plans instead")


def database_work(read) -> int:
    """The SQLite virtual machine's instructions that ``read()`` takes: what the database does for it."""
    from django.db import connection

    counted = [0]

    def count() -> int:
        counted[0] += 1
        return 0  # go on

    connection.ensure_connection()
    connection.connection.set_progress_handler(count, 1)
    try:
        read()
    finally:
        connection.connection.set_progress_handler(None, 1)
    return counted[0]


def run_of(team, catalog, points: int, *, metrics=("loss",)) -> Run:
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name=f"{points} points")
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name=name, value=1.0, wall_time=100.0 + step)
                                     for step in range(points, 0, -1) for name in metrics])
    Run.objects.filter(pk=run.pk).update(current_step=points)
    run.refresh_from_db()
    return run


@counts_sqlite_instructions
def test_a_poll_with_new_points_finds_the_time_they_count_from_without_reading_every_point(team, catalog, sent_tasks):
    """Page speed: a poll of ``state.json`` that finds new points times them from the run's first point, and
    read every point of the run for it (MIN(wall_time)): 100,000 rows every 2 s on a long run. The
    (run, wall_time) index answers it: the database does as much for a run of 3,000 points as for one of 3."""
    work = {}
    for points in (3, 3000):
        run = run_of(team, catalog, points)
        assert selectors._start_time(run) == 101.0
        work[points] = database_work(lambda: selectors._start_time(run))
    assert work[3000] <= work[3] + 20, work


@counts_sqlite_instructions
def test_a_poll_reads_only_the_points_after_its_steps_not_every_point_of_the_run(team, catalog, sent_tasks):
    """Page speed: a poll of ``state.json`` (every 2 s without events) asks for the points after the steps the
    page holds, and the database went through every point of the run in the (run, name, step) index to find
    them, even when none was new. Through the (run, step) index it reads only the new ones: a poll of a run
    of 3,000 steps costs what one of 30 steps does, whether nothing is new, 2 steps are, or a rarely logged
    metric lags (an eval every 10 steps, named apart in ``after_steps``)."""
    work = {}
    for steps in (30, 3000):
        run = run_of(team, catalog, steps, metrics=("loss", "grad_norm"))
        MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="eval/loss", value=1.0, wall_time=100.0)
                                         for step in range(10, steps + 1, 10)])
        polls = {"nothing new": {"after_step": steps},
                 "2 new steps": {"after_step": steps - 2},
                 "an eval lags": {"after_step": steps - 10, "after_steps": {"loss": steps - 2, "grad_norm": steps - 2}}}
        assert {name: entry["step"] for name, entry in selectors.metric_series(run=run, **polls["an eval lags"]).items()} == {
            "loss": [steps - 1, steps], "grad_norm": [steps - 1, steps], "eval/loss": [steps]}
        for poll, query in polls.items():
            work[poll, steps] = database_work(lambda: selectors.metric_series(run=run, **query))
    for poll in ("nothing new", "2 new steps", "an eval lags"):
        assert work[poll, 3000] <= 1.5 * work[poll, 30], work


@counts_sqlite_instructions
def test_the_points_since_stored_buckets_and_the_newest_point_are_found_without_reading_the_run(
        team, catalog, sent_tasks):
    """Page speed, and why the run foreign key keeps its own index although the (run, step), (run, wall_time)
    and (run, name, step) indexes all start with the run: on SQLite each entry of an index ends with the row
    id, so the run's own index is a (run, id) index, and the points stored since a run's stored buckets
    (``id > through_id``) and its newest point's id are ranges of it. Without it both read every point of the
    run, through the (run, step) index: 30 ms for a run of 100,000 points against 0.04 ms (bench/RESULTS.md)."""
    work = {}
    for steps in (30, 3000):
        run = run_of(team, catalog, steps)
        Run.objects.filter(pk=run.pk).update(series_cache={"buckets": selectors.series_buckets(run=run).to_json()})
        MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=2.0, wall_time=100.0 + step)
                                         for step in (steps + 1, steps + 2)])
        Run.objects.filter(pk=run.pk).update(current_step=steps + 2)
        run.refresh_from_db()
        newest = MetricPoint.objects.get(run=run, step=steps + 2).pk
        assert selectors.last_point_id(run=run) == newest
        assert selectors.series_buckets(run=run).through_id == newest
        work["points since the buckets", steps] = database_work(lambda: selectors.series_buckets(run=run))
        work["newest point", steps] = database_work(lambda: selectors.last_point_id(run=run))
    for read in ("points since the buckets", "newest point"):
        assert work[read, 3000] <= 1.5 * work[read, 30] + 20, work


def test_a_tag_filter_is_a_whole_match_case_aside_read_from_the_tag_rows_index(team, catalog, sent_tasks):
    """The ``?tag=`` filter and ``sweep_runs`` matched the JSON text of every run's tags (a LIKE over each run's list,
    case aside); they read ``RunTag``'s (project, tag_folded) index, the whole tag, case aside (a project spells
    each tag one way: ``services.run_tags_write``)."""
    from django.test.utils import CaptureQueriesContext

    tagged = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="tagged",
                                 tags="sweep-1, say \"hi\"")
    services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, name="others",
                        tags="sweep-10, sweep")
    for tag in ("sweep-1", 'say "hi"'):
        assert [run.name for run in selectors.run_list(project=team.project, filters=selectors.RunFilters(tag=tag))
                ] == ["tagged"]
        assert selectors.sweep_runs(project=team.project, tag=tag) == [tagged]
    assert selectors.sweep_runs(project=team.project, tag="Sweep-1") == [tagged]
    assert selectors.sweep_runs(project=team.project, tag="sweep-") == []
    assert selectors.sweep_runs(project=team.outsider_project, tag="sweep-1") == []
    with CaptureQueriesContext(connection) as queries:
        selectors.sweep_runs(project=team.project, tag="sweep-1")
    [query] = queries.captured_queries
    condition = query["sql"].split(" WHERE ", 1)[1]
    assert 'FROM "runs_runtag"' in condition and '."tag_folded" = ' in condition, condition
    assert '"runs_run"."tags"' not in condition and "LIKE" not in condition.upper(), condition
