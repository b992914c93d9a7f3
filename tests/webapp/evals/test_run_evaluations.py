"""A run's models evaluated together and drawn across its steps: ``services.evaluations_create_for_run`` (one
evaluation per exported checkpoint and the final model, all checked before any is saved, those evaluated so already
skipped, at most ``MAX_RUN_EVALUATIONS`` at a press, the checkpoints not exported counted), the run page's curves
(``selectors.evaluation_curves``) and the New evaluation page's *Every checkpoint of run …*."""
import json

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.webapp.factories import make_ready_version
from webapp.evals import selectors, services
from webapp.evals.forms import EVERY_MODEL
from webapp.evals.models import Evaluation, EvaluationStatus, Metric
from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

from .conftest import PROMPT_ROWS

SETTINGS = services.EvaluationSettings(row_limit=6, max_new_tokens=8)


def a_run(team, root, *, exported=(10, 20), saved=(10, 20, 25, 30), final_step=30, status=RunStatus.SUCCEEDED):
    """A run of ``final_step`` steps whose directory under ``root`` holds training checkpoints at ``saved``, with the
    checkpoints at ``exported`` exported and, succeeded, its final model."""
    run = Run.objects.create(project=team.project, name="<i>tuned</i>", task="sft", status=status,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(root)}, created_by=team.owner,
                             current_step=final_step, total_steps=final_step)
    for step in saved:
        (root / "checkpoints" / str(step)).mkdir(parents=True)
    for step in exported:
        (root / f"export-step-{step}").mkdir(parents=True)
        Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=step, path=str(root / f"export-step-{step}"))
    if status == RunStatus.SUCCEEDED:
        (root / "export").mkdir(parents=True)
        Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=final_step, path=str(root / "export"))
    return run


def for_run(team, run, version, settings=SETTINGS):
    return services.evaluations_create_for_run(project=team.project, run=run, version=version, settings=settings,
                                               user=team.teammate)


def test_it_queues_one_evaluation_per_exported_checkpoint_and_the_final_model(
        team, prompts_version, tmp_path, sent_tasks, django_capture_on_commit_callbacks):
    run = a_run(team, tmp_path / "run")
    with django_capture_on_commit_callbacks(execute=True):
        done = for_run(team, run, prompts_version)
    assert [evaluation.model_ref for evaluation in done.created] == [
        f"{run.public_id}:step-10", f"{run.public_id}:step-20", run.public_id]  # in step order, the final model last
    assert {(evaluation.metric, evaluation.row_limit, evaluation.max_new_tokens, evaluation.dataset_version_id)
            for evaluation in done.created} == {(Metric.EXACT_MATCH, 6, 8, prompts_version.pk)}
    # Step 25 was saved but never exported, so nothing serves it; step 30's checkpoint is the final model.
    assert (done.skipped, done.left, done.not_exported) == ([], [], [25])
    assert sent_tasks == [(services.EVALUATION_TASK, [evaluation.pk], "serve") for evaluation in done.created]
    assert Evaluation.objects.count() == 3


def test_models_evaluated_so_already_are_skipped(team, prompts_version, tmp_path, sent_tasks):
    run = a_run(team, tmp_path / "run")
    first = for_run(team, run, prompts_version).created
    services.evaluation_start(evaluation_id=first[0].pk)
    services.evaluation_finish(evaluation_id=first[0].pk, result={"metric": "exact_match", "value": 0.5, "count": 6})
    services.evaluation_start(evaluation_id=first[1].pk)
    services.evaluation_fail(evaluation_id=first[1].pk, reason="out of memory")  # failed: evaluated again
    # The final model's is still queued: skipped too, as the succeeded one.
    again = for_run(team, run, prompts_version)
    assert [evaluation.model_ref for evaluation in again.created] == [f"{run.public_id}:step-20"]
    assert again.skipped == [f"{run.public_id}:step-10", run.public_id]
    # Another figure (fewer rows; reward functions) is another curve: every model again.
    fewer = for_run(team, run, prompts_version, services.EvaluationSettings(row_limit=3))
    by_rewards = for_run(team, run, prompts_version,
                         services.EvaluationSettings(row_limit=6, reward_terms=[{"name": "numeric_match"}]))
    assert len(fewer.created) == len(by_rewards.created) == 3 and fewer.skipped == by_rewards.skipped == []


def test_it_saves_nothing_when_anything_is_refused_naming_the_field(team, prompts_version, sft_version, tmp_path,
                                                                    settings, sent_tasks):
    run = a_run(team, tmp_path / "run")
    for version, changed, field, words in (
            (prompts_version, {"group_by": "colour"}, "group_by", "row 1 of sums v1 has no 'colour' value"),
            (sft_version, {"reward_terms": [{"name": "numeric_match"}]}, "reward_terms", "is an sft dataset")):
        with pytest.raises(ValidationError) as refused:
            for_run(team, run, version, services.EvaluationSettings(row_limit=6, **changed))
        assert words in " ".join(refused.value.message_dict[field])
    # One checkpoint's export folder deleted since (under the data root, where Temper judges that): none is queued.
    gone = settings.DATA_ROOT / "runs" / run.public_id / "export-step-15"
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=15, path=str(gone))
    with pytest.raises(ValidationError) as refused:
        for_run(team, run, prompts_version)
    assert refused.value.message_dict["model"][0].startswith("checkpoint 15 of run \u2068<i>tuned</i>\u2069 (")
    assert not Evaluation.objects.exists() and sent_tasks == []


def test_a_run_with_no_exported_model_is_refused_saying_what_to_do(team, prompts_version, tmp_path):
    run = a_run(team, tmp_path / "run", exported=(), status=RunStatus.FAILED)
    with pytest.raises(ValidationError) as refused:
        for_run(team, run, prompts_version)
    assert "has no model to evaluate: export its checkpoints on the run's page (Checkpoints) first" in (
        refused.value.message_dict["model"][0])
    assert not Evaluation.objects.exists()


def test_a_running_runs_checkpoints_are_not_counted_as_left_out(team, tmp_path):
    """Exports are of a run that has ended: a running run's checkpoints are not 'to export' yet."""
    run = a_run(team, tmp_path / "run", exported=(), status=RunStatus.RUNNING)
    assert selectors.unexported_checkpoints(run=run) == []
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED)
    run.refresh_from_db()
    assert selectors.unexported_checkpoints(run=run) == [10, 20, 25, 30]  # no final model: step 30's counts too


def test_at_most_the_cap_are_queued_spread_over_the_steps_the_next_press_queues_the_rest(
        team, prompts_version, tmp_path, monkeypatch):
    monkeypatch.setattr(services, "MAX_RUN_EVALUATIONS", 3)
    run = a_run(team, tmp_path / "run", exported=(5, 10, 15, 20, 25), saved=())
    steps = lambda done: [selectors.model_step(evaluation.model_ref, final_step=30) for evaluation in done.created]  # noqa: E731
    first = for_run(team, run, prompts_version)
    assert steps(first) == [5, 15, 30] and len(first.left) == 3  # the first, one between, the final model
    second = for_run(team, run, prompts_version)
    assert steps(second) == [10, 20, 25] and second.left == [] and len(second.skipped) == 3
    assert Evaluation.objects.count() == 6


def test_spread_keeps_the_ends_and_the_order():
    assert services.spread(list(range(10)), 4) == [0, 3, 6, 9]
    assert services.spread([1, 2], 5) == [1, 2]
    assert services.spread([1, 2, 3], 1) == [3]


def evaluation(model_ref, value, *, metric=Metric.EXACT_MATCH, version="sums v1", rows=200, terms=(),
               status=EvaluationStatus.SUCCEEDED):
    """An evaluation made by hand, unsaved: the curves are read from what ``evaluation_list`` gives."""
    return Evaluation(model_ref=model_ref, model_label=f"Run: {model_ref}", version_label=version, metric=metric,
                      row_limit=rows, max_new_tokens=8, reward_terms=list(terms), status=status,
                      result={"metric": metric, "value": value} if status == EvaluationStatus.SUCCEEDED else {})


def test_curves_put_each_models_newest_score_at_its_step_one_line_per_figure():
    newest_first = [
        evaluation("run_a:step-20", 0.6), evaluation("run_a", 0.4), evaluation("run_a:step-10", 0.2),
        evaluation("run_a:step-20", 0.1),  # older, superseded by the 0.6
        evaluation("run_b:step-20", 0.9),  # another run's
        evaluation("run_a:step-30", None, status=EvaluationStatus.FAILED),
        evaluation("run_a:step-10", 2.0, metric=Metric.LOSS, version="chats v1"),
        evaluation("run_a:step-20", 1.5, metric=Metric.LOSS, version="chats v1"),
        evaluation("run_a", 1.8, metric=Metric.LOSS, version="chats v1"),
        evaluation("run_a", float("nan"), metric=Metric.LOSS, version="chats v1"),  # never drawn (nor JSON)
    ]
    exact, loss = selectors.evaluation_curves(evaluations=newest_first, run_id="run_a", final_step=40)
    assert exact["name"] == "sums v1 · exact match · 200 rows · ≤8 new tokens" and exact["higher_is_better"]
    assert [(point["step"], point["value"], point["best"]) for point in exact["points"]] == [
        (10, 0.2, False), (20, 0.6, True), (40, 0.4, False)]  # the final model at the run's last step
    assert exact["points"][1]["model"] == "Run: run_a:step-20"
    assert loss["name"] == "chats v1 · loss · 200 rows" and not loss["higher_is_better"]
    assert [(point["step"], point["value"], point["best"]) for point in loss["points"]] == [
        (10, 2.0, False), (20, 1.5, True), (40, 1.8, False)]  # lowest loss best
    json.dumps([exact, loss], allow_nan=False)


def test_a_reward_curve_is_keyed_on_its_terms_and_the_earliest_of_equal_bests_is_best():
    terms = [{"name": "numeric_match", "weight": 2.0, "args": {}}]
    curves = selectors.evaluation_curves(evaluations=[
        evaluation("run_a", 1.5, metric=Metric.REWARDS, terms=terms),
        evaluation("run_a:step-5", 1.5, metric=Metric.REWARDS, terms=terms),
        evaluation("run_a:step-2", 0.5, metric=Metric.REWARDS, terms=terms),
        evaluation("run_a:step-5", 0.1, metric=Metric.REWARDS, rows=50, terms=terms),
        evaluation("run_a:step-5", 1.0, metric=Metric.REWARDS, terms=[{**terms[0], "weight": 1.0}]),
    ], run_id="run_a", final_step=9)
    assert [curve["name"] for curve in curves] == [
        "sums v1 · reward functions · 200 rows · ≤8 new tokens · numeric_match × 2",
        "sums v1 · reward functions · 50 rows · ≤8 new tokens · numeric_match × 2",
        "sums v1 · reward functions · 200 rows · ≤8 new tokens · numeric_match"]
    assert [(point["step"], point["best"]) for point in curves[0]["points"]] == [(2, False), (5, True), (9, False)]


def test_the_run_page_draws_no_curve_of_one_step_and_says_how_to_get_one(team, client_for, tmp_path):
    """A run whose final model alone was scored drew "Across checkpoints" as a lone star on an axis from step 29 to 31
    and from -1 to 1: a chart of nothing, where the way to a curve (score its checkpoints) went unsaid."""
    version = make_ready_version(team.project, name="sums", kind="prompts", rows=PROMPT_ROWS, user=team.owner)
    run = a_run(team, tmp_path / "run")
    for metric in ("exact_match", "rewards"):
        Evaluation.objects.create(project=team.project, model_ref=run.public_id, model_label="Run: tuned",
                                  dataset_version=version, version_label=str(version), metric=metric,
                                  row_limit=6, max_new_tokens=8, status=EvaluationStatus.SUCCEEDED,
                                  result={"metric": metric, "value": 0.5, "count": 6})
    page_url = reverse("runs:detail", args=[team.project.slug, run.public_id])
    page = client_for(team.teammate).get(page_url).content.decode()
    assert 'id="evaluation-curves"' not in page and "evaluation-curves-data" not in page
    assert ("Only one step of this run is scored so far: evaluate its checkpoints (Evaluate every checkpoint…) to "
            "see the scores against the steps." in page)
    Evaluation.objects.create(project=team.project, model_ref=f"{run.public_id}:step-10", model_label="Run: tuned",
                              dataset_version=version, version_label=str(version), metric="exact_match", row_limit=6,
                              max_new_tokens=8, status=EvaluationStatus.SUCCEEDED,
                              result={"metric": "exact_match", "value": 0.25, "count": 6})
    page = client_for(team.teammate).get(page_url).content.decode()
    assert 'id="evaluation-curves"' in page and "Only one step" not in page


def test_the_run_page_draws_the_curves_from_escaped_json_and_offers_every_checkpoint_to_members(
        team, client_for, tmp_path):
    version = make_ready_version(team.project, name="<b>sums</b>", kind="prompts", rows=PROMPT_ROWS, user=team.owner)
    run = a_run(team, tmp_path / "run")
    for ref, value in ((f"{run.public_id}:step-10", 0.25), (run.public_id, 0.75)):
        Evaluation.objects.create(project=team.project, model_ref=ref, model_label=f"Run: <i>tuned</i> {ref}",
                                  dataset_version=version, version_label=str(version), metric="exact_match",
                                  row_limit=6, max_new_tokens=8, status=EvaluationStatus.SUCCEEDED,
                                  result={"metric": "exact_match", "value": value, "count": 6})
    page_url = reverse("runs:detail", args=[team.project.slug, run.public_id])
    page = client_for(team.viewer).get(page_url).content.decode()
    script = page[page.index('<script id="evaluation-curves-data" type="application/json">'):]
    data = json.loads(script[script.index(">") + 1:script.index("</script>")])
    assert [(point["step"], point["value"], point["best"]) for point in data[0]["points"]] == [
        (10, 0.25, False), (30, 0.75, True)]
    assert data[0]["name"] == "<b>sums</b> v1 · exact match · 6 rows · ≤8 new tokens"
    assert "<b>sums</b>" not in script[:script.index("</script>")]  # json_script escaped it: text, never markup
    assert "evaluation_curves.js" in page
    assert "1 checkpoint of this run is not exported" in page and 'href="#checkpoints"' in page
    assert 'id="evaluate-every-checkpoint"' not in page  # a viewer evaluates nothing
    every = f'{reverse("evals:create", args=[team.project.slug])}?run={run.public_id}'
    assert f'href="{every}" id="evaluate-every-checkpoint"' in client_for(team.teammate).get(page_url).content.decode()


def test_the_run_page_reads_each_evaluations_value_not_its_result_in_as_many_queries_for_any_number(
        team, client_for, prompts_version, tmp_path):
    """A run evaluated at every checkpoint has hundreds of evaluations, each result holding kilobytes of examples:
    the page draws their values alone (``selectors.run_page_evaluations``, the value read in the database)."""
    run = a_run(team, tmp_path / "run")
    page_url = reverse("runs:detail", args=[team.project.slug, run.public_id])
    examples = [{"prompt": "q" * 2048, "completion": "a", "answer": "1", "correct": False}] * 5

    def evaluated(count: int, *, start: int) -> None:
        Evaluation.objects.bulk_create([Evaluation(
            project=team.project, model_ref=f"{run.public_id}:step-{10 * (start + index + 1)}", model_label="m",
            dataset_version=prompts_version, version_label=str(prompts_version), metric="exact_match", row_limit=6,
            max_new_tokens=8, status=EvaluationStatus.SUCCEEDED,
            result={"metric": "exact_match", "value": (start + index) / 4, "count": 6, "examples": examples})
            for index in range(count)])

    def page_queries() -> tuple[int, str]:
        with CaptureQueriesContext(connection) as queries:
            page = client_for(team.viewer).get(page_url).content.decode()
        return len(queries.captured_queries), page

    evaluated(2, start=0)
    page_queries()  # its first load stores the run's chart cache
    few, _page = page_queries()
    evaluated(10, start=2)
    many, page = page_queries()
    assert few == many
    assert 'data-value="2.75">2.7500</span>' in page  # the newest, in the table
    loaded = selectors.run_page_evaluations(project=team.project, run_id=run.public_id)
    assert len(loaded) == 12 and all("result" in evaluation.get_deferred_fields() for evaluation in loaded)
    assert sorted(evaluation.value for evaluation in loaded) == [index / 4 for index in range(12)]
    curve, = selectors.evaluation_curves(evaluations=loaded, run_id=run.public_id, final_step=run.current_step)
    assert [point["value"] for point in curve["points"]][:3] == [0.0, 0.25, 0.5]


def test_the_new_evaluation_page_evaluates_every_checkpoint_of_the_run_it_is_linked_from(
        team, client_for, prompts_version, tmp_path, sent_tasks):
    run = a_run(team, tmp_path / "run")
    url = f'{reverse("evals:create", args=[team.project.slug])}?run={run.public_id}'
    member = client_for(team.teammate)
    page = member.get(url).content.decode()
    every = f"{run.public_id}:{EVERY_MODEL}"
    assert f'<option value="{every}" selected>' in page
    assert "1 checkpoint (step 25) is not exported" in page
    assert f'href="{reverse("runs:detail", args=[team.project.slug, run.public_id])}#checkpoints"' in page
    response = member.post(url, {"model": every, "dataset_version": prompts_version.public_id, "row_limit": 6,
                                 "max_new_tokens": 8, "group_by": ""}, follow=True)
    assert response.redirect_chain == [(reverse("runs:detail", args=[team.project.slug, run.public_id])
                                         + "#run-evaluations", 302)]
    assert Evaluation.objects.count() == 3
    said = response.content.decode()
    assert ("Queued 3 evaluations of run <i>tuned</i>" not in said
            and "Queued 3 evaluations of run" in said and "1 checkpoint not exported left out" in said)
    # Refused as a whole, said on the form: nothing saved.
    response = member.post(url, {"model": every, "dataset_version": prompts_version.public_id, "row_limit": 6,
                                 "max_new_tokens": 8, "group_by": "colour"})
    assert response.status_code == 400 and "has no &#x27;colour&#x27; value" in response.content.decode()
    assert Evaluation.objects.count() == 3
    # Without ?run= (or for another project's run) no such choice: the value is refused as any unknown model.
    assert "every-checkpoint" not in member.get(reverse("evals:create", args=[team.project.slug])).content.decode()
    assert client_for(team.outsider).get(url).status_code == 404
