"""A member evaluates a tiny base model from its page's Evaluate… link; a real serve worker scores it while the
evaluation's page refreshes itself, which then shows the value, the groups and the model's completions (escaped),
and the Evaluations page lists it side by side."""
import pytest

from tests.browser.test_datasets import screenshot
from tests.browser.test_review import log_in
from tests.factories import build_tiny_model_dir
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.core.bidi import isolated
from webapp.evals.models import Evaluation

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
    finally:
        context.close()
