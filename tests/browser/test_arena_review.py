"""An owner sends arena battles to team review from the arena page (a ticked battle, then every
decisive vote not yet sent, with no duplicates) and starts a campaign on the votes from the
leaderboard; a reviewer then sees the battle's text escaped on the review page."""
import pytest

from tests.browser import test_projects
from tests.browser.test_datasets import screenshot
from tests.browser.test_review import log_in
from tests.webapp.factories import make_base_model, make_team
from webapp.core.bidi import isolated
from webapp.chat import arena, selectors, services
from webapp.chat.models import Battle
from webapp.review import services as review_services
from webapp.review.models import Campaign

pytestmark = pytest.mark.browser


def voted_battle(team, user, prompt, outcome, answers):
    battle = arena.battle_create(project=team.project, user=user, prompt=prompt,
                                 choices=selectors.model_choices(project=team.project))
    for side, text in zip((battle.side_a, battle.side_b), answers):
        services.message_finish(message_id=arena.battle_answer(side).public_id, text=text, finish_reason="stop")
    return arena.battle_vote(battle=battle, outcome=outcome)


def test_battles_go_to_review_from_the_arena_and_the_leaderboard(browser, live_server, monkeypatch):
    # The answers are written here; no serve worker generates them.
    monkeypatch.setattr(services.celery_app, "send_task", lambda name, args, queue, **options: None)
    base = live_server.url
    team = make_team()
    for name in ("falcon", "heron"):
        make_base_model(team.project, name=name, path=f"/models/{name}")
    mine = voted_battle(team, team.owner, "<b>Name</b> a colour.", "a", ("<img src=x onerror=alert(1)>", "Seven."))
    voted_battle(team, team.owner, "Say hi.", "tie", ("Hi.", "Hello."))
    theirs = voted_battle(team, team.teammate, "Name a bird.", "b", ("Blue.", "Robin."))
    campaign = review_services.campaign_create(project=team.project, name="arena pass", guidelines="",
                                               source_version=None, required_reviews=1, reviewers=[team.teammate],
                                               user=team.owner)
    contexts = [browser.new_context(viewport={"width": 1280, "height": 900}) for _ in range(2)]
    try:
        owner, reviewer = log_in(contexts[0], base, "alpha-owner"), log_in(contexts[1], base, "alpha-teammate")
        owner.goto(f"{base}/p/alpha/arena/")
        owner.get_by_label("Send “<b>Name</b> a colour.” to review").check()
        owner.select_option("#id_review_campaign", label=f"{isolated('arena pass')} (0 items)")
        with owner.expect_navigation():
            owner.get_by_role("button", name="Send ticked battles").click()
        assert "1 battle added to \u2068arena pass\u2069." in owner.locator(".messages").inner_text()
        screenshot(owner, "arena-to-review")
        with owner.expect_navigation():
            owner.get_by_role("button", name="Send all decisive battles not yet sent").click()
        assert "1 battle added to \u2068arena pass\u2069; 1 already there." in owner.locator(".messages").inner_text()
        assert sorted(item.metadata["battle"] for item in campaign.items.all()) == sorted(
            [mine.public_id, theirs.public_id])

        owner.get_by_role("link", name="Leaderboard").click()
        owner.locator("#arena-campaign-form input[name=name]").fill("all votes")
        owner.fill("#id_arena_required_reviews", "1")
        with owner.expect_navigation():
            owner.get_by_role("button", name="New review campaign from arena votes").click()
        assert owner.locator(".page-head h1").inner_text() == "all votes"
        assert owner.locator(".status-counts li").last.inner_text() == "of 2 items"
        new = Campaign.objects.get(name="all votes")
        assert new.items.count() == 2

        reviewer.goto(f"{base}/p/alpha/review/{campaign.public_id}/next/")
        assert reviewer.locator(".prompt .text").inner_text() in ("<b>Name</b> a colour.", "Name a bird.")
        while reviewer.locator(".prompt .text").inner_text() != "<b>Name</b> a colour.":
            with reviewer.expect_navigation():
                reviewer.keyboard.press("s")  # skip to the next item
        texts = reviewer.locator(".response .text").all_inner_texts()
        assert "<img src=x onerror=alert(1)>" in texts, "shown as text, not as an image"
        assert reviewer.locator(".prompt b, .response img").count() == 0
    finally:
        for context in contexts:
            context.close()


def test_text_inputs_written_without_a_type_look_like_the_others(page, live_server):
    """An <input> with no type attribute is a text box, but the site's input rule named input[type=text]
    only: the arena's dataset and campaign names and the chat page's token name were bare browser boxes."""
    team = make_team()
    make_base_model(team.project, name="falcon", path="/models/falcon")
    test_projects.log_in(page, live_server.url, team.owner.username)
    look = "element => { const s = getComputedStyle(element); return [s.borderRadius, s.paddingLeft, s.borderTopColor]; }"
    page.goto(f"{live_server.url}/p/alpha/chat/")
    styled = page.locator("#id_max_tokens").evaluate(look)
    assert styled[0] == "6px"
    assert page.get_by_label("Token name").evaluate(look) == styled
    page.goto(f"{live_server.url}/p/alpha/arena/")
    assert page.get_by_label("Dataset name").evaluate(look) == styled
    assert page.get_by_label("Campaign name").evaluate(look) == styled


def test_the_battle_form_names_its_fields(page, live_server):
    """The prompt box had no visible label and sat at the browser's default width, and the compare-mode
    selects were two unnamed '— random —' boxes: nothing said which model would be A and which B."""
    team = make_team()
    make_base_model(team.project, name="falcon " + "with a long name " * 8, path="/models/falcon")
    page = log_in(page.context, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/alpha/arena/")
    form = page.locator("#new-battle")
    for label in ("Prompt", "Model A", "Model B"):
        assert form.locator("label", has_text=label).is_visible()
        assert form.get_by_label(label, exact=True).is_visible()
    form_width = form.evaluate("element => element.clientWidth")
    assert form.get_by_label("Prompt").evaluate("element => element.offsetWidth") >= form_width * 0.9
    first, second = form.get_by_label("Model A").bounding_box(), form.get_by_label("Model B").bounding_box()
    assert first["y"] == second["y"]
    box = form.bounding_box()
    assert second["x"] + second["width"] <= box["x"] + box["width"], "a long model name widens no select past the form"


def test_a_switch_variable_is_the_chat_panels_select_in_the_arena_and_a_generated_campaign(page, live_server,
                                                                                          monkeypatch, tmp_path):
    """QA: terse, which the persona template only asks whether it holds, was a select of true/false in the chat panel
    but a text box in the arena's compare mode and on the generated campaign form. Both show the chat panel's select,
    shown and enabled as model A or B reads it, and send what is picked."""
    from tests.factories import build_bpe_tokenizer_dir
    from tests.webapp.chat.test_template_variables import PERSONA_TEMPLATE
    from tests.webapp.factories import make_ready_version

    monkeypatch.setattr(services.celery_app, "send_task", lambda *args, **kwargs: None)  # no serve worker answers
    team = make_team()
    persona = make_base_model(team.project, name="persona", path=str(
        build_bpe_tokenizer_dir(tmp_path / "persona", chat_template=PERSONA_TEMPLATE)))
    plain = make_base_model(team.project, name="plain", path=str(build_bpe_tokenizer_dir(tmp_path / "plain")))
    make_ready_version(team.project, name="asks", kind="prompts", rows=[{"prompt": "Name a colour."}])
    page = log_in(page.context, live_server.url, team.owner.username)

    page.goto(f"{live_server.url}/p/alpha/arena/")
    page.fill("#id_prompt", "Hi")
    page.select_option("#id_model_a", persona.public_id)
    page.select_option("#id_model_b", plain.public_id)
    page.locator("#arena-variables summary").click()
    terse = page.get_by_label("terse")
    assert terse.evaluate("element => element.tagName") == "SELECT" and terse.is_enabled()
    assert page.get_by_label("persona").evaluate("element => element.tagName") == "INPUT"
    terse.select_option("true")
    with page.expect_navigation():
        page.get_by_role("button", name="Battle").click()
    battle = Battle.objects.get(project=team.project)
    assert battle.side_a.template_variables == {"terse": True} and battle.side_b.template_variables == {}

    page.goto(f"{live_server.url}/p/alpha/review/new/generated/")
    page.fill("#id_name", "terse pass")
    page.select_option("#id_model_a", plain.public_id)
    page.select_option("#id_model_b", plain.public_id)
    terse = page.get_by_label("terse (chat template variable)")
    assert not terse.is_visible() and terse.is_disabled()  # neither model picked reads it
    page.select_option("#id_model_b", persona.public_id)
    assert terse.evaluate("element => element.tagName") == "SELECT" and terse.is_visible() and terse.is_enabled()
    terse.select_option("false")
    page.fill("#id_prompt_count", "1")
    with page.expect_navigation():
        page.get_by_role("button", name="Generate and create campaign").click()
    campaign = Campaign.objects.get(name="terse pass")
    assert campaign.generation["model_b"]["template_variables"] == {"terse": False}
