"""A member evaluates a tiny base model from its page's Evaluate… link; a real serve worker scores it while the
evaluation's page refreshes itself, which then shows the value, the groups and the model's completions (escaped),
and the Evaluations page lists it side by side; evaluated again by reward functions picked in the reward rows, its
page shows the weighted total and each function's mean, in a table of its own on the Evaluations page."""
import pytest

from tests.browser.test_datasets import screenshot
from tests.browser.test_review import log_in
from tests.factories import build_tiny_model_dir
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.core.bidi import isolated
from webapp.evals.models import Evaluation
from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

pytestmark = pytest.mark.browser

ROWS = [{"prompt": f"<b>Question {index}</b>: name a colour.", "answer": "blue", "task": ("warm", "cold")[index % 2]}
        for index in range(4)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-evaluation-browser"), seed=2)


def test_a_member_evaluates_a_base_model_and_sees_the_result(browser, live_server, celery_workers, transactional_db,
                                                             settings, redis_url, model_dir):
    settings.REDIS_URL = redis_url
    celery_workers.ensure("serve")
    base = live_server.url
    team = make_team()
    model = make_base_model(team.project, name="tiny", path=str(model_dir))
    make_ready_version(team.project, name="colours", kind="prompts", rows=ROWS, user=team.owner)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = log_in(context, base, "alpha-teammate")
        page.goto(f"{base}/p/alpha/models/{model.public_id}/")
        page.get_by_role("link", name="Evaluate…").click()
        assert page.locator("#id_model option:checked").inner_text() == f"Base model: {isolated('tiny')}"
        page.select_option("#id_dataset_version", label=f"{isolated('colours')} v1 (prompts, 4 rows)")
        page.fill("#id_row_limit", "4")
        page.fill("#id_max_new_tokens", "6")
        page.fill("#id_group_by", "task")
        with page.expect_navigation():
            page.get_by_role("button", name="Evaluate").click()
        # The serve worker scores it; the page refreshes itself until the result is in.
        page.locator("#evaluation-result").wait_for(timeout=180_000)
        evaluation = Evaluation.objects.get()
        assert evaluation.status == "succeeded", evaluation.error
        assert page.locator("#evaluation-result .eval-value").inner_text() == f"{evaluation.result['value']:.4f}"
        assert page.locator("#evaluation-groups tbody tr").count() == 2
        assert page.locator("#evaluation-examples tbody tr").first.locator("td").first.inner_text() == (
            "<b>Question 0</b>: name a colour.")  # dataset text shown as text, never as markup
        screenshot(page, "evaluation-result")
        page.get_by_role("link", name="Evaluations", exact=True).click()
        assert page.locator(".comparison").count() == 1
        assert page.locator(".comparison tbody tr").first.locator("td").first.inner_text() == "Base model: tiny"

        # Again, scored by reward functions picked in the launch page's reward rows.
        page.go_back()
        page.get_by_role("link", name="Evaluate again…").click()
        page.fill("#id_row_limit", "4")
        page.fill("#id_max_new_tokens", "6")
        page.fill("#id_group_by", "task")
        assert not page.locator("#reward-functions").is_visible()  # read only when scoring by them
        page.get_by_label("reward functions", exact=True).check()
        assert page.locator("#reward-functions").is_visible()
        rows = page.locator("#spec-reward_terms .reward-row")
        page.locator("#spec-reward_terms button.reward-add").click()
        rows.nth(0).locator("select.reward-function").select_option("contains")
        assert rows.nth(0).locator(".reward-args[data-function=contains]").is_visible()
        page.fill("#spec-reward_terms-0-contains-keywords", "e")
        rows.nth(0).locator("input[name='reward_terms.0.weight']").fill("2")
        page.locator("#spec-reward_terms button.reward-add").click()
        rows.nth(1).locator("select.reward-function").select_option("length_target")
        page.fill("#spec-reward_terms-1-length_target-target", "8")
        with page.expect_navigation():
            page.get_by_role("button", name="Evaluate").click()
        page.locator("#evaluation-result").wait_for(timeout=180_000)
        scored = Evaluation.objects.get(metric="rewards")
        assert scored.status == "succeeded", scored.error
        assert scored.reward_terms == [{"name": "contains", "weight": 2.0, "args": {"keywords": ["e"]}},
                                       {"name": "length_target", "weight": 1.0, "args": {"target": 8}}]
        assert page.locator("#evaluation-result h2").inner_text() == f"Weighted total: {scored.result['value']:.4f}"
        means = page.locator("#evaluation-term-means tbody tr")
        assert means.count() == 2 and means.nth(1).locator("td").nth(2).inner_text() == (
            f"{scored.result['terms']['length_target']:.4f}")
        assert page.locator("#evaluation-groups thead th").all_text_contents() == [  # as written, not as styled
            "Group", "Weighted total", "contains", "length_target", "Rows"]
        screenshot(page, "evaluation-rewards-result")
        page.get_by_role("link", name="Evaluations", exact=True).click()
        assert page.locator(".comparison").count() == 2  # exact match and these terms: each its own table
    finally:
        context.close()


def test_a_run_page_lists_its_evaluations_and_a_version_page_offers_one_at_phone_width(
        browser, live_server, transactional_db, tmp_path):
    """At 390 px: the run page's Evaluations table keeps each figure on one line and links to the list filtered to
    the run; its chart draws the scores against the steps, the best starred; *Evaluate every checkpoint…* opens the
    form with the run's models chosen together, and those evaluated so already are skipped; a ready prompts version's
    *Evaluate a model on it* opens the form with it chosen."""
    base = live_server.url
    team = make_team()
    version = make_ready_version(team.project, name="colours", kind="prompts", rows=ROWS, user=team.owner)
    other = make_ready_version(team.project, name="chats", kind="sft", user=team.owner)
    run = Run.objects.create(project=team.project, name="sft", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner,
                             total_steps=3, current_step=3)
    for kind, step, folder in ((ArtifactKind.MODEL, 3, "export"), (ArtifactKind.CHECKPOINT, 2, "export-step-2")):
        (tmp_path / folder).mkdir()
        Artifact.objects.create(run=run, kind=kind, step=step, path=str(tmp_path / folder))
    for model_ref, value in ((run.public_id, 0.123456), (f"{run.public_id}:step-2", 0.5)):
        Evaluation.objects.create(project=team.project, model_ref=model_ref, model_label=f"Run: sft {model_ref}",
                                  dataset_version=version, version_label=str(version), metric="exact_match",
                                  row_limit=4, max_new_tokens=8, status="succeeded", created_by=team.teammate,
                                  result={"metric": "exact_match", "value": value, "count": 4})
    context = browser.new_context(viewport={"width": 390, "height": 900})
    try:
        page = log_in(context, base, "alpha-teammate")
        page.goto(f"{base}/p/alpha/runs/{run.public_id}/")
        values = page.locator("#run-evaluations .eval-value")
        assert values.all_inner_texts() == ["0.5000", "0.1235"]  # newest first
        line_height = float(values.first.evaluate("element => parseFloat(getComputedStyle(element).lineHeight)"))
        assert values.first.bounding_box()["height"] < 1.5 * line_height  # one line, not "0.500" over "0"
        # The curve: step 2's 0.5 (the best, starred) and the final model's 0.1235 at step 3, each labelled.
        chart = page.locator("#evaluation-curves")
        chart.locator(".main-svg").first.wait_for()
        assert chart.locator(".scatterlayer .point").count() == 2
        assert chart.locator(".textpoint").all_text_contents() == ["0.5", "0.1235"]
        assert chart.evaluate("plot => plot._fullData[0].marker.symbol") == ["star", "circle"]
        screenshot(page, "run-evaluations-390")
        page.locator("#evaluate-every-checkpoint").click()
        assert page.locator("#id_model option:checked").inner_text().startswith("Every checkpoint of run")
        page.select_option("#id_dataset_version", label=f"{isolated('colours')} v1 (prompts, 4 rows)")
        page.fill("#id_row_limit", "4")
        page.fill("#id_max_new_tokens", "8")  # as the two scored: the same figure
        with page.expect_navigation():
            page.get_by_role("button", name="Evaluate").click()
        assert page.url.endswith(f"/runs/{run.public_id}/#run-evaluations")
        assert page.locator(".messages").inner_text().startswith(
            f"Nothing queued for run {isolated('sft')}; 2 models evaluated so already (or being evaluated) skipped.")
        page.goto(f"{base}/p/alpha/runs/{run.public_id}/")
        page.locator("#run-evaluations-all").click()
        assert page.locator("#evaluations tbody tr").count() == 2
        page.goto(f"{base}/p/alpha/datasets/{version.dataset.public_id}/v/1/")
        page.get_by_role("link", name="Evaluate a model on it").click()
        assert page.locator("#id_dataset_version option:checked").inner_text() == (
            f"{isolated('colours')} v1 (prompts, 4 rows)")
        assert other.public_id in page.locator("#id_dataset_version").inner_html()  # the others still offered
    finally:
        context.close()
