"""What a team met on a second first-use pass, through the preference and RL workflows in the browser (a review
campaign on two models' answers, its export, DPO and GRPO runs, their comparison, the arena)."""
import pytest

from tests.browser.test_projects import log_in
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
