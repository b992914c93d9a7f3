"""What a team met on a second first-use pass, through the preference and RL workflows in the browser (a review
campaign on two models' answers, its export, DPO and GRPO runs, their comparison, the arena)."""
import pytest

from tests.browser.test_projects import log_in
from tests.browser.test_runs import scroll_to_the_hyperparameters
from tests.webapp.factories import make_ready_version, make_team
from webapp.review import services as review_services

pytestmark = pytest.mark.browser


def test_a_campaigns_facts_and_guidelines_stack_on_a_phone(browser, live_server, monkeypatch):
    """At 390 px a campaign's page set its Campaign and Guidelines cards side by side, 165 px each: the
    source ran a word a line ("answers of | Base | model: …"), the card as tall as a screen."""
    monkeypatch.setattr(review_services.celery_app, "send_task", lambda *args, **kwargs: None)
    team = make_team()
    version = make_ready_version(team.project, name="preferences", kind="preference",
                                 rows=[{"prompt": f"q{i}", "chosen": "a", "rejected": "b"} for i in range(3)],
                                 user=team.owner)
    campaign = review_services.campaign_create(project=team.project, name="pass 1", guidelines="Prefer the shorter.",
                                               required_reviews=1, reviewers=[team.owner], source_version=version,
                                               user=team.owner)
    review_services.campaign_load_items(campaign_id=campaign.pk)
    for width, side_by_side in ((390, False), (1280, True)):
        context = browser.new_context(viewport={"width": width, "height": 800})
        try:
            page = context.new_page()
            log_in(page, live_server.url, team.owner.username)
            page.goto(f"{live_server.url}/p/alpha/review/{campaign.public_id}/")
            facts = page.locator(".review-columns > .card").first.bounding_box()
            guidelines = page.locator(".review-columns > .card.guidelines").bounding_box()
            assert (guidelines["y"] < facts["y"] + facts["height"]) is side_by_side, width
            if not side_by_side:
                assert facts["width"] >= 300 and guidelines["width"] >= 300
        finally:
            context.close()


def axis_name_letters(page) -> list[list[tuple[float, float]]]:
    """The screen position of every letter of each axis name of the compare page's parallel coordinates."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('#hyperparameters-plot .axis-title')).map(text => {
        const toScreen = text.getScreenCTM(), letters = [];
        for (let index = 0; index < text.getNumberOfChars(); index++) {
            const start = text.getStartPositionOfChar(index), end = text.getEndPositionOfChar(index);
            const middle = new DOMPoint((start.x + end.x) / 2, (start.y + end.y) / 2).matrixTransform(toScreen);
            letters.push([middle.x, middle.y]);
        }
        return letters; })""")


@pytest.mark.parametrize("width", [1280, 390])
def test_the_hyperparameter_axes_names_do_not_run_into_each_other(page, live_server, monkeypatch, width):
    """At 1280 px, comparing an SFT, a DPO and a GRPO run drew 13 axes 75 px apart, their names level and centred:
    "optim.learning_rate (log)" ran into "optim.warmup_steps", "train.eval_every (log)" into "train.eval_samples".
    At 390 px the 13 axes were 17 px apart, names and ticks one smudge: the chart keeps its axes apart and scrolls
    sideways inside its card, the page no wider than the phone."""
    from tests.webapp.factories import make_base_model
    from webapp.runs import services as run_services
    from webapp.runs.models import MetricPoint

    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    team = make_team()
    model = make_base_model(team.project)
    data = make_ready_version(team.project)
    runs = []
    for index in range(3):
        spec = {"task": "sft", "model": model.public_id, "data": {"train": data.public_id, "max_seq_len": 128 * (index + 1)},
                "optim": {"learning_rate": 10.0 ** -(index + 3), "warmup_steps": index, "weight_decay": index / 10,
                          "max_grad_norm": index + 1.0, "adam_beta1": 0.9 - index / 10},
                "train": {"max_steps": 10 * (index + 1), "batch_size": index + 1, "eval_every": 10 ** index,
                          "save_every": 5 * (index + 1), "keep_last": index + 1, "grad_accum": index + 1,
                          "eval_samples": 4 * (index + 1)}}
        run = run_services.run_create(project=team.project, spec=spec, user=team.owner, name=f"run {index}")
        run.final_metrics = {"loss": {"last": 2.0 - index / 2, "min": 1.0, "max": 3.0}}
        run.save(update_fields=["final_metrics"])
        MetricPoint.objects.create(run=run, step=1, name="loss", value=2.0 - index / 2, wall_time=1.0, tokens=100)
        runs.append(run)
    log_in(page, live_server.url, team.owner.username)
    page.set_viewport_size({"width": width, "height": 800})
    page.goto(f"{live_server.url}/p/alpha/runs/compare/?" + "&".join(f"runs={run.public_id}" for run in runs))
    scroll_to_the_hyperparameters(page)
    page.wait_for_function("() => document.querySelectorAll('#hyperparameters-plot .axis-title').length >= 13")
    names = axis_name_letters(page)
    closest = min(((ax - bx) ** 2 + (ay - by) ** 2) ** 0.5
                  for first, second in zip(names, names[1:]) for ax, ay in first for bx, by in second)
    assert closest >= 10, f"two axis names' letters {closest:.1f} px apart"
    axes = page.evaluate("() => Array.from(document.querySelectorAll('#hyperparameters-plot .y-axis'))"
                         ".map(axis => axis.transform.baseVal.consolidate()?.matrix.e ?? 0)")  # its x in the plot
    assert min(right - left for left, right in zip(axes, axes[1:])) >= 60
    assert page.evaluate("document.documentElement.scrollWidth") <= width


def test_charts_and_the_final_table_give_the_seconds_of_time_metrics(page, live_server, tmp_path):
    """A GRPO run's time/rollout, time/logprobs and time/update charts (and their compare columns, "0.051
    0.051 – 18.44") gave numbers without a unit: seconds, which their names do not say as memory/host_peak_gib
    and tokens_per_second do."""
    from webapp.runs.models import MetricPoint, Run, RunStatus

    team = make_team()
    runs = [Run.objects.create(project=team.project, name=name, task="grpo", status=RunStatus.SUCCEEDED,
                               spec={"task": "grpo"}, resolved_spec={"output_dir": str(tmp_path / name)},
                               created_by=team.owner, total_steps=3, current_step=3,
                               final_metrics={"loss": {"last": 0.1, "min": 0.1, "max": 0.3},
                                              "time/rollout": {"last": 2.5, "min": 2.0, "max": 9.0}})
            for name in ("first", "second")]
    MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name=name, value=step + 0.5, wall_time=float(step),
                                                 tokens=step)
                                     for run in runs for name in ("loss", "time/rollout") for step in (1, 2, 3)])
    y_title = ("metric => { const plot = document.querySelector(`.plot[data-metric='${metric}']`);"
               " return plot && plot.layout ? ((plot.layout.yaxis.title || {}).text || '') : null; }")
    log_in(page, live_server.url, team.viewer.username)
    page.goto(f"{live_server.url}/p/alpha/runs/{runs[0].public_id}/")
    page.wait_for_function(f"() => ({y_title})('time/rollout') !== null")
    assert page.evaluate(y_title, "time/rollout") == "seconds" and page.evaluate(y_title, "loss") == ""
    page.goto(f"{live_server.url}/p/alpha/runs/compare/?runs={runs[0].public_id}&runs={runs[1].public_id}")
    page.wait_for_function(f"() => ({y_title})('time/rollout') !== null")
    assert page.evaluate(y_title, "time/rollout") == "seconds" and page.evaluate(y_title, "loss") == ""
    headers = page.locator("#compare-finals .final-table thead th").all_inner_texts()
    assert [header.split("\n")[0] for header in headers[1:]] == ["loss", "time/rollout (seconds)"]
