"""The owner starts a campaign on two tiny models' answers through the form; a real serve worker
generates them while the campaign page shows its progress, then a reviewer gets the items."""
import unicodedata

import pytest

from tests.browser.test_datasets import screenshot
from tests.browser.test_review import log_in
from tests.factories import build_tiny_model_dir
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.core.bidi import isolated
from webapp.review.models import Campaign

pytestmark = pytest.mark.browser

def visible(text: str) -> str:
    """``text`` as an HTML page holds it: the random tiny models write control characters, and HTML
    parsing turns carriage returns into line feeds and drops some controls."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return "".join(char for char in text if char == "\n" or unicodedata.category(char) != "Cc")


PROMPTS = [{"prompt": f"Question {index}: name a colour."} for index in range(3)]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return [build_tiny_model_dir(tmp_path_factory.mktemp(f"tiny-review-browser-{seed}"), seed=seed) for seed in (0, 5)]


def test_a_campaign_on_two_models_answers(browser, live_server, celery_workers, transactional_db, settings,
                                          redis_url, model_dirs):
    settings.REDIS_URL = redis_url
    celery_workers.ensure("serve")
    base = live_server.url
    team = make_team()
    for index, path in enumerate(model_dirs):
        make_base_model(team.project, name=f"tiny-{index}", path=str(path))
    make_ready_version(team.project, name="questions", kind="prompts", rows=PROMPTS, user=team.owner)
    contexts = [browser.new_context(viewport={"width": 1280, "height": 900}) for _ in range(2)]
    try:
        owner, reviewer = log_in(contexts[0], base, "alpha-owner"), log_in(contexts[1], base, "alpha-teammate")
        owner.goto(f"{base}/p/alpha/review/")
        owner.get_by_role("link", name="New campaign on two models' answers").click()
        owner.fill("#id_name", "tiny duel")
        owner.select_option("#id_model_a", label=f"Base model: {isolated('tiny-0')}")
        owner.select_option("#id_model_b", label=f"Base model: {isolated('tiny-1')}")
        owner.select_option("#id_prompts_version", label=f"{isolated('questions')} v1 (prompts, 3 rows)")
        owner.fill("#id_prompt_count", "3")
        owner.fill("#id_max_new_tokens", "8")
        owner.fill("#id_temperature", "0")
        owner.fill("#id_required_reviews", "1")
        owner.get_by_label("alpha-teammate").check()
        with owner.expect_navigation():
            owner.get_by_role("button", name="Generate and create campaign").click()
        assert owner.locator(".facts .model-a").inner_text() == "Base model: tiny-0"
        # The serve worker answers; the page refreshes itself until the items are in.
        owner.locator(".campaign-generating").wait_for(state="detached", timeout=120_000)
        assert owner.locator(".status-counts li").last.inner_text() == "of 3 items"
        screenshot(owner, "review-generated-campaign")
        campaign = Campaign.objects.get(name="tiny duel")
        reviewer.goto(f"{base}/p/alpha/review/{campaign.public_id}/next/")
        assert reviewer.locator(".prompt .text").inner_text() == "Question 0: name a colour."
        first, second = (reviewer.locator(".response .text").nth(index).text_content() for index in (0, 1))
        item = campaign.items.get(sequence=1)
        assert {visible(first), visible(second)} == {visible(item.response_a), visible(item.response_b)}
    finally:
        for context in contexts:
            context.close()
