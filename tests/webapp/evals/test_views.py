"""Evaluation pages: members create (from the form, prefilled from a model's page), viewers read, outsiders get 404;
the detail page refreshes while the evaluation is under way and escapes model output and dataset text."""
import re
from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from tests.webapp.evals.conftest import create
from tests.webapp.factories import form_token, make_ready_version, make_user
from webapp.core.bidi import isolated
from webapp.datasets.models import VersionStatus
from webapp.evals import services
from webapp.evals.models import Evaluation, EvaluationStatus
from webapp.projects import services as project_services
from webapp.projects.models import Role
from webapp.runs import services as run_services
from webapp.runs.models import Run, RunStatus


def post_form(client, team, base_model, version, **overrides):
    url = reverse("evals:create", args=[team.project.slug])
    data = {"model": base_model.public_id, "dataset_version": version.public_id, "row_limit": 4,
            "max_new_tokens": 8, "group_by": ""} | overrides
    return client.post(url, data)


def test_a_member_creates_one_from_the_form(team, client_for, base_model, prompts_version, sent_tasks):
    url = reverse("evals:create", args=[team.project.slug])
    page = client_for(team.teammate).get(f"{url}?model={base_model.public_id}").content.decode()
    assert f'<option value="{base_model.public_id}" selected>' in page
    assert f"{isolated('sums')} v1 (prompts, 6 rows)" in page
    response = post_form(client_for(team.teammate), team, base_model, prompts_version, group_by="task")
    evaluation = Evaluation.objects.get()
    assert response.status_code == 302
    assert response.url == reverse("evals:detail", args=[team.project.slug, evaluation.public_id])
    assert (evaluation.row_limit, evaluation.max_new_tokens, evaluation.group_by) == (4, 8, "task")
    page = client_for(team.viewer).get(response.url).content.decode()
    assert "Waiting for a serve worker" in page and 'http-equiv="refresh"' in page


def test_the_forms_reward_functions_are_named_once(team, client_for, base_model, prompts_version):
    """First-hour walk: "Reward functions" stood twice, the box's legend and the rows' label under it. The legend
    names the rows (a group a screen reader announces); the label, which named a box that takes no input, is gone."""
    page = client_for(team.teammate).get(reverse("evals:create", args=[team.project.slug])).content.decode()
    box = page[page.index('<fieldset id="reward-functions"'):page.index("</fieldset>", page.index('id="reward-functions"'))]
    assert box.count("Reward functions") == 1 and "<legend>Reward functions</legend>" in box
    assert '<label for="spec-reward_terms">' not in page


def test_the_form_names_the_field_the_service_rejects(team, client_for, base_model, prompts_version):
    response = post_form(client_for(team.teammate), team, base_model, prompts_version, group_by="colour")
    assert response.status_code == 400
    assert "has no &#x27;colour&#x27; value to group by" in response.content.decode()
    assert not Evaluation.objects.exists()


def test_it_requires_access(team, client_for, base_model, prompts_version):
    evaluation = create(team, base_model, prompts_version)
    detail = reverse("evals:detail", args=[team.project.slug, evaluation.public_id])
    listed = reverse("evals:list", args=[team.project.slug])
    for url in (detail, listed, reverse("evals:create", args=[team.project.slug])):
        assert client_for(team.outsider).get(url).status_code == 404
    assert client_for(team.viewer).get(detail).status_code == 200
    assert client_for(team.viewer).get(listed).status_code == 200
    assert client_for(team.viewer).get(reverse("evals:create", args=[team.project.slug])).status_code == 403
    assert post_form(client_for(team.viewer), team, base_model, prompts_version).status_code == 403
    assert client_for(team.viewer).post(reverse("evals:cancel", args=[team.project.slug,
                                                                      evaluation.public_id])).status_code == 403
    outsider_url = reverse("evals:detail", args=[team.outsider_project.slug, evaluation.public_id])
    assert client_for(team.outsider).get(outsider_url).status_code == 404  # not found through their own project
    assert Evaluation.objects.count() == 1


def test_the_result_shows_groups_and_escaped_examples(team, client_for, base_model, prompts_version):
    evaluation = create(team, base_model, prompts_version, group_by="task")
    services.evaluation_start(evaluation_id=evaluation.pk)
    services.evaluation_finish(evaluation_id=evaluation.pk, result={
        "metric": "exact_match", "value": 0.5, "count": 6, "by": "task",
        "groups": {"count": {"value": 1.0, "count": 3}, "sum": {"value": 0.0, "count": 3}},
        "examples": [{"prompt": "<b>bold</b> prompt", "answer": "<i>1</i>", "text": "<script>alert(1)</script>"},
                     {"prompt": [{"role": "user", "content": "Hi"}], "answer": "2", "text": "2"}]})
    detail = reverse("evals:detail", args=[team.project.slug, evaluation.public_id])
    page = client_for(team.viewer).get(detail).content.decode()
    assert 'data-value="0.5"' in page and 'http-equiv="refresh"' not in page
    assert "<td><bdi>count</bdi></td><td class=\"num\">1.0000</td><td class=\"num\">3</td>" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert "&lt;b&gt;bold&lt;/b&gt; prompt" in page and "&lt;i&gt;1&lt;/i&gt;" in page
    assert "&quot;role&quot;: &quot;user&quot;" in page  # a chat prompt as JSON, not as Python's list
    listed = client_for(team.viewer).get(reverse("evals:list", args=[team.project.slug])).content.decode()
    assert "Side by side" in listed and 'data-value="0.5"' in listed


def test_a_version_shorter_than_the_row_limit_is_said_to_be_read_whole(team, client_for, base_model,
                                                                       prompts_version):
    """A 10-row held-out set scored at the form's default of 200 rows read "on the first 200 rows" over a table of
    10: a newcomer wondered where the other 190 were."""
    evaluation = create(team, base_model, prompts_version)  # 6 rows, the default limit of 200
    services.evaluation_start(evaluation_id=evaluation.pk)
    services.evaluation_finish(evaluation_id=evaluation.pk, result={"metric": "exact_match", "value": 0.5, "count": 6})
    client = client_for(team.viewer)
    for page in (client.get(reverse("evals:detail", args=[team.project.slug, evaluation.public_id])),
                 client.get(reverse("evals:list", args=[team.project.slug]))):
        text = page.content.decode()
        assert "on all 6 rows" in text and "first 200 rows" not in text
    longer = create(team, base_model, prompts_version, row_limit=4)
    services.evaluation_start(evaluation_id=longer.pk)
    services.evaluation_finish(evaluation_id=longer.pk, result={"metric": "exact_match", "value": 0.5, "count": 4})
    assert "on the first 4 rows" in client.get(reverse("evals:detail", args=[team.project.slug,
                                                                           longer.public_id])).content.decode()


def test_a_member_cancels_then_deletes_one(team, client_for, base_model, prompts_version):
    evaluation = create(team, base_model, prompts_version)
    member = client_for(team.teammate)
    detail = reverse("evals:detail", args=[team.project.slug, evaluation.public_id])
    cancel = reverse("evals:cancel", args=[team.project.slug, evaluation.public_id])
    page = member.get(detail).content.decode()
    response = member.post(cancel, {"submission_token": form_token(page, after=cancel)}, follow=True)
    assert response.redirect_chain == [(detail, 302)]
    assert Evaluation.objects.get().status == EvaluationStatus.CANCELLED
    page = response.content.decode()
    delete = reverse("evals:delete", args=[team.project.slug, evaluation.public_id])
    response = member.post(delete, {"submission_token": form_token(page, after=delete)})
    assert response.url == reverse("evals:list", args=[team.project.slug])
    assert not Evaluation.objects.exists()


def test_only_an_owner_or_its_launcher_deletes_one(team, client_for, base_model, prompts_version):
    carol = make_user("carol")
    project_services.membership_add(project=team.project, user=carol, role=Role.MEMBER)
    evaluation = create(team, base_model, prompts_version)  # the teammate's
    services.evaluation_cancel(evaluation=evaluation, user=team.teammate)
    detail = reverse("evals:detail", args=[team.project.slug, evaluation.public_id])
    delete = reverse("evals:delete", args=[team.project.slug, evaluation.public_id])
    assert 'id="delete-confirm"' not in client_for(carol).get(detail).content.decode()
    assert client_for(carol).post(delete).status_code == 403
    assert 'id="delete-confirm"' in client_for(team.owner).get(detail).content.decode()
    assert Evaluation.objects.exists()
    assert client_for(team.owner).post(delete).status_code == 302
    assert not Evaluation.objects.exists()


def test_a_run_and_a_base_model_page_offer_evaluate(team, client_for, base_model):
    page = client_for(team.teammate).get(reverse("basemodels:detail", args=[team.project.slug,
                                                                            base_model.public_id])).content.decode()
    assert f'{reverse("evals:create", args=[team.project.slug])}?model={base_model.public_id}' in page


def test_the_form_reads_the_answer_column_and_names_a_missing_one(team, client_for, base_model):
    version = make_ready_version(team.project, name="solved", kind="prompts",
                                 rows=[{"prompt": "1 + 1?", "solution": "2"}])
    member = client_for(team.teammate)
    response = post_form(member, team, base_model, version)
    assert response.status_code == 400
    assert "row 1 of solved v1 has no &#x27;answer&#x27; text" in response.content.decode()
    assert not Evaluation.objects.exists()
    assert post_form(member, team, base_model, version, answer_column="solution").status_code == 302
    assert Evaluation.objects.get().answer_column == "solution"


def test_a_ready_prompts_or_sft_version_offers_evaluate_prefilled(team, client_for, prompts_version, sft_version):
    pairs = make_ready_version(team.project, name="pairs", kind="preference",
                               rows=[{"prompt": "a", "chosen": "b", "rejected": "c"}])
    create_url = reverse("evals:create", args=[team.project.slug])

    def version_page(user, version):
        return client_for(user).get(reverse("datasets:version", args=[
            team.project.slug, version.dataset.public_id, version.number])).content.decode()

    for version in (prompts_version, sft_version):
        assert f'href="{create_url}?version={version.public_id}">Evaluate a model on it' in version_page(
            team.teammate, version)
    assert "Evaluate a model on it" not in version_page(team.teammate, pairs)
    assert "Evaluate a model on it" not in version_page(team.viewer, prompts_version)
    form = client_for(team.teammate).get(f"{create_url}?version={sft_version.public_id}").content.decode()
    assert f'<option value="{sft_version.public_id}" selected>' in form


def evaluation_of(team, model_ref, version, *, value=None, minutes_ago=0):
    evaluation = Evaluation.objects.create(
        project=team.project, model_ref=model_ref, model_label=f"Run: {model_ref}", dataset_version=version,
        version_label=str(version), metric="exact_match", row_limit=6, max_new_tokens=8,
        status=EvaluationStatus.SUCCEEDED if value is not None else EvaluationStatus.FAILED,
        result={"metric": "exact_match", "value": value, "count": 6} if value is not None else {},
        created_by=team.teammate)
    Evaluation.objects.filter(pk=evaluation.pk).update(created_at=timezone.now() - timedelta(minutes=minutes_ago))
    return evaluation


def test_the_page_is_headed_by_the_model_and_the_data(team, client_for, base_model, prompts_version):
    """First-hour walk: the heading read "Evaluation of Run: arith lora eval". It names the model and the data as a
    sentence would, the kind of model in a muted line under it (names still isolated, and escaped)."""
    client = client_for(team.viewer)
    for model_ref, label, kind in (
            ("run_a1", "Run: arith <b>lora</b> eval", "The model exported by a run"),
            ("run_a1:step-40", "Run: arith <b>lora</b> eval, checkpoint 40", "A checkpoint of a run"),
            (base_model.public_id, "Base model: arith <b>lora</b> eval", "A base model")):
        evaluation = evaluation_of(team, model_ref, prompts_version, value=0.5)
        Evaluation.objects.filter(pk=evaluation.pk).update(model_label=label)
        page = client.get(reverse("evals:detail", args=[team.project.slug, evaluation.public_id])).content.decode()
        name = label.partition(": ")[2].replace("<", "&lt;").replace(">", "&gt;")
        assert f"<h1><bdi>{name}</bdi> on <bdi>sums v1</bdi></h1>" in page, label
        assert f'<p class="muted model-kind">{kind}</p>' in page and "Evaluation of" not in page


def a_run(team, base_model, sft_version):
    return run_services.run_create(project=team.project, user=team.owner, name="first", spec={
        "task": "sft", "model": base_model.public_id, "data": {"train": sft_version.public_id},
        "train": {"max_steps": 10}})


def test_a_run_page_lists_its_newest_evaluations_linking_to_them_all(team, client_for, base_model, prompts_version,
                                                                     sft_version):
    run = a_run(team, base_model, sft_version)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    mine = [evaluation_of(team, run.public_id, prompts_version, value=index / 10, minutes_ago=10 - index)
            for index in range(6)]
    checkpoint = evaluation_of(team, f"{run.public_id}:step-5", prompts_version, minutes_ago=0)  # failed
    other = evaluation_of(team, base_model.public_id, prompts_version, value=0.9, minutes_ago=30)
    page = client_for(team.viewer).get(reverse("runs:detail", args=[team.project.slug, run.public_id])).content.decode()
    section = page[page.index('id="run-evaluations"'):]
    section = section[:section.index("</section>")]
    shown = [evaluation.public_id for evaluation in (checkpoint, *mine[::-1][:4])]
    positions = [section.index(f"/evaluations/{public_id}/") for public_id in shown]
    assert positions == sorted(positions)  # newest first
    assert mine[0].public_id not in section and mine[1].public_id not in section and other.public_id not in section
    assert 'data-value="0.5"' in section and ">failed</a>" in section
    listed = reverse("evals:list", args=[team.project.slug])
    assert f'href="{listed}?model={run.public_id}" id="run-evaluations-all">All 7 evaluations of this run' in section

    filtered = client_for(team.viewer).get(f"{listed}?model={run.public_id}").content.decode()
    table = filtered[filtered.index('id="evaluations"'):]
    assert all(evaluation.public_id in table for evaluation in (*mine, checkpoint))
    assert other.public_id not in table
    assert "Side by side" in filtered and other.public_id in filtered  # what it stands beside, the base model too
    assert other.public_id in client_for(team.viewer).get(listed).content.decode()


def test_a_run_without_evaluations_shows_no_section(team, client_for, base_model, sft_version):
    run = a_run(team, base_model, sft_version)
    page = client_for(team.viewer).get(reverse("runs:detail", args=[team.project.slug, run.public_id])).content.decode()
    assert 'id="run-evaluations"' not in page


def test_a_link_to_a_version_that_cannot_be_evaluated_says_why(team, client_for, prompts_version):
    broken = make_ready_version(team.project, name="broken", kind="prompts", rows=[{"prompt": "a", "answer": "b"}])
    broken.status = VersionStatus.FAILED
    broken.save()
    url = reverse("evals:create", args=[team.project.slug])
    page = client_for(team.teammate).get(f"{url}?version={broken.public_id}").content.decode()
    assert 'id="version-refused"' in page and "broken v1 failed its check" in page
    page = client_for(team.teammate).get(f"{url}?version=dv_nosuchversion").content.decode()
    assert "&#x27;dv_nosuchversion&#x27; is not a dataset version of this project" in page
    page = client_for(team.teammate).get(f"{url}?version={prompts_version.public_id}").content.decode()
    assert 'id="version-refused"' not in page


def test_the_detail_page_links_the_model_while_it_exists(team, client_for, base_model, prompts_version):
    evaluation = create(team, base_model, prompts_version)
    detail = reverse("evals:detail", args=[team.project.slug, evaluation.public_id])
    page = client_for(team.viewer).get(detail).content.decode()
    model_url = reverse("basemodels:detail", args=[team.project.slug, base_model.public_id])
    assert f'<a href="{model_url}" id="evaluation-model">' in page
    services.evaluation_cancel(evaluation=evaluation, user=team.teammate)
    base_model.delete()
    page = client_for(team.viewer).get(detail).content.decode()
    assert 'id="evaluation-model"' not in page and "(deleted)" in page


REWARD_ROWS = {"score_by": "rewards", "reward_terms.0.name": "contains", "reward_terms.0.weight": "2",
               "reward_terms.0.args.contains.keywords": "4\n<b>", "reward_terms.3.name": "numeric_match"}


def test_a_member_scores_by_reward_functions_from_the_forms_reward_rows(team, client_for, base_model,
                                                                        prompts_version, sent_tasks):
    page = client_for(team.teammate).get(reverse("evals:create", args=[team.project.slug])).content.decode()
    assert 'name="score_by" value="rewards"' in page and 'class="reward-list" id="spec-reward_terms"' in page
    assert "reward_rows.js" in page and "runs_new.js" not in page  # the launch page's rows, not its launch script
    response = post_form(client_for(team.teammate), team, base_model, prompts_version, group_by="task",
                         **REWARD_ROWS)
    evaluation = Evaluation.objects.get()
    assert response.status_code == 302, response.content.decode()
    assert (evaluation.metric, evaluation.group_by) == ("rewards", "task")
    assert evaluation.reward_terms == [{"name": "contains", "weight": 2.0, "args": {"keywords": ["4", "<b>"]}},
                                       {"name": "numeric_match", "weight": 1.0, "args": {}}]
    # Scoring by exact match, the rows are not read.
    post_form(client_for(team.teammate), team, base_model, prompts_version, **{**REWARD_ROWS, "score_by": "exact_match"})
    assert Evaluation.objects.latest("id").metric == "exact_match" and Evaluation.objects.latest("id").reward_terms == []


def test_a_refused_reward_row_is_named_at_its_input_and_nothing_is_saved(team, client_for, base_model,
                                                                         prompts_version, sent_tasks):
    client = client_for(team.teammate)
    response = post_form(client, team, base_model, prompts_version, score_by="rewards",
                         **{"reward_terms.0.name": "format_regex"})
    page = response.content.decode()
    assert response.status_code == 400
    assert ('<small class="error">format_regex: required argument missing: pattern (a text)</small>' in page
            and "The reward functions were refused: see their rows below." in page)
    response = post_form(client, team, base_model, prompts_version, **{**REWARD_ROWS, "reward_terms.0.weight": "heavy"})
    page = response.content.decode()
    assert response.status_code == 400 and "weight: &#x27;heavy&#x27; is not a number" in page
    assert "The reward functions were refused: see their rows below." in page
    assert not Evaluation.objects.exists() and sent_tasks == []


def test_scoring_by_reward_functions_without_one_says_how_to_add_one(team, client_for, base_model, prompts_version,
                                                                     sent_tasks):
    """The form said "see their rows below" over no rows, and below the YAML of the API: "give a list of reward
    functions, each {name, weight, args}, e.g. [{name: exact_match}]"."""
    response = post_form(client_for(team.teammate), team, base_model, prompts_version, score_by="rewards")
    page = response.content.decode()
    assert response.status_code == 400
    assert ("No reward function chosen: press Add a reward function and choose one, or score by exact match."
            in page)
    assert "see their rows below" not in page and "{name, weight, args}" not in page
    assert not Evaluation.objects.exists() and sent_tasks == []


def test_a_grpo_run_chosen_by_its_link_fills_in_its_reward_functions(team, client_for, base_model, prompts_version):
    run = Run.objects.create(project=team.project, name="rl", task="grpo", status=RunStatus.SUCCEEDED,
                             created_by=team.owner, resolved_spec={}, spec={
                                 "task": "grpo", "model": base_model.public_id,
                                 "data": {"train": prompts_version.public_id},
                                 "grpo": {"rewards": [{"name": "contains", "weight": 0.5, "args": {"keywords": ["Paris"]}}],
                                          "eval_metrics": [{"name": "numeric_match"}]}})
    url = reverse("evals:create", args=[team.project.slug])
    page = client_for(team.teammate).get(f"{url}?model={run.public_id}:20").content.decode()
    assert re.search(r'<input type="radio" name="score_by" value="rewards"[^>]* checked>', page)
    assert '<option value="numeric_match" selected>' in page and '<option value="contains" selected>' in page
    assert 'name="reward_terms.1.weight" value="0.5"' in page and ">Paris</textarea>" in page
    plain = client_for(team.teammate).get(f"{url}?model={base_model.public_id}").content.decode()
    assert '<option value="contains" selected>' not in plain


def test_the_result_by_reward_functions_shows_each_terms_mean_escaped(team, client_for, base_model,
                                                                      prompts_version):
    evaluation = create(team, base_model, prompts_version, group_by="task",
                        reward_terms=[{"name": "contains", "weight": 2, "args": {"keywords": ["<b>"]}},
                                      {"name": "valid_json"}])
    services.evaluation_start(evaluation_id=evaluation.pk)
    services.evaluation_finish(evaluation_id=evaluation.pk, result={
        "metric": "rewards", "value": 1.25, "count": 6, "terms": {"contains": 0.5, "valid_json": 0.25}, "by": "task",
        "groups": {"count": {"value": 2.0, "count": 3, "terms": {"contains": 0.75, "valid_json": 0.5}}},
        "examples": [{"prompt": "p", "answer": "1", "text": "<i>x</i>", "total": 3.0,
                      "scores": {"contains": 1.0, "valid_json": 1.0}}]})
    page = client_for(team.viewer).get(reverse("evals:detail", args=[team.project.slug, evaluation.public_id])
                                       ).content.decode()
    assert "Weighted total: " in page and 'data-value="1.25"' in page
    assert '<td><code>contains</code></td><td class="num">2.0</td><td class="num">0.5000</td>' in page
    assert ('<td><bdi>count</bdi></td><td class="num">2.0000</td><td class="num">0.7500</td><td class="num">0.5000</td>'
            in page)
    assert "&lt;i&gt;x&lt;/i&gt;" in page and '<td class="num">3.0000</td>' in page
    assert "&quot;keywords&quot;: [&quot;&lt;b&gt;&quot;]" in page and "<b>" not in page.split("evaluation-terms")[1][:300]
    # Evaluate again… (another model, say) fills in the same functions, so that it stands beside this one.
    again = f"{reverse('evals:create', args=[team.project.slug])}?model={base_model.public_id}&amp;version=" \
            f"{prompts_version.public_id}&amp;terms_of={evaluation.public_id}"
    assert again in client_for(team.teammate).get(reverse("evals:detail", args=[team.project.slug,
                                                                         evaluation.public_id])).content.decode()
    form = client_for(team.teammate).get(again.replace("&amp;", "&")).content.decode()
    assert re.search(r'<input type="radio" name="score_by" value="rewards"[^>]* checked>', form)
    assert '<option value="valid_json" selected>' in form and 'name="reward_terms.0.weight" value="2.0"' in form
    outsiders = client_for(team.teammate).get(again.replace("&amp;", "&").replace(evaluation.public_id, "ev_nope"))
    assert '<option value="valid_json" selected>' not in outsiders.content.decode()
    listed = client_for(team.viewer).get(reverse("evals:list", args=[team.project.slug])).content.decode()
    assert "reward functions (<span class=\"reward-terms\">contains × 2 {&quot;keywords&quot;: [&quot;&lt;b&gt;&quot;]}; valid_json</span>)" in listed


def test_a_running_evaluation_shows_its_rows_scored_so_far(team, client_for, base_model, prompts_version):
    """QA: the page said only "The serve worker is scoring it" for however long 500 rows took. It says how many rows
    the worker has generated (counted after each slice) while it refreshes itself."""
    evaluation = create(team, base_model, prompts_version)
    detail = reverse("evals:detail", args=[team.project.slug, evaluation.public_id])
    services.evaluation_start(evaluation_id=evaluation.pk)
    page = client_for(team.viewer).get(detail).content.decode()
    assert "The serve worker is scoring it." in page and "Scoring:" not in page
    assert services.evaluation_progress(evaluation_id=evaluation.pk, rows_done=1280, rows_total=5000)
    page = client_for(team.viewer).get(detail).content.decode()
    assert '<span id="evaluation-progress">Scoring: 1,280 of 5,000 rows.</span>' in page
    assert 'http-equiv="refresh"' in page
    services.evaluation_cancel(evaluation=evaluation, user=team.teammate)
    assert not services.evaluation_progress(evaluation_id=evaluation.pk, rows_done=1536, rows_total=5000), (
        "the worker is not told to stop")
    page = client_for(team.viewer).get(detail).content.decode()
    assert "Scoring:" not in page and Evaluation.objects.get().rows_done == 1280
