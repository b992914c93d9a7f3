"""The owner starts a campaign (the worker loads its items), two reviewers review the same items in
their own browsers with the keyboard and disagree on one, the owner resolves the conflict and exports
the reviewed pairs as a dataset version that the worker validates."""
import json

import pytest

from tests.browser import test_projects
from tests.browser.test_datasets import screenshot
from tests.live import wait_for
from tests.webapp.factories import make_ready_version, make_team, make_user
from webapp.core.bidi import isolated
from webapp.projects import services as project_services
from webapp.projects.models import Role
from webapp.review.models import Campaign, CampaignStatus, Item, ItemStatus, Review

pytestmark = pytest.mark.browser

ROWS = [{"prompt": f"Question {number}?", "chosen": f"right answer {number}", "rejected": f"wrong answer {number}"}
        for number in (1, 2, 3)]


def log_in(context, base_url, username):
    page = context.new_page()
    page.set_default_timeout(15_000)
    test_projects.log_in(page, base_url, username)
    return page


def answer_with_keys(page, *, pick: str, edit: str | None = None) -> None:
    """Answer the item on ``page`` with the keyboard: 1 or 2 for the response containing ``pick``,
    after replacing that response's text with ``edit`` (``e`` opens the edit boxes) when given."""
    first = pick in page.locator(".response-first .text").inner_text()
    if edit is not None:
        page.keyboard.press("e")
        assert page.locator("textarea[name=edited_first]").evaluate("element => element === document.activeElement")
        box = page.locator("textarea[name=edited_first]" if first else "textarea[name=edited_second]")
        box.fill(edit)
        page.keyboard.press("Escape")
    with page.expect_navigation():
        page.keyboard.press("1" if first else "2")


def test_two_reviewers_a_conflict_and_the_export(browser, live_server, default_worker):
    base = live_server.url
    team = make_team()
    carol = make_user("carol")
    project_services.membership_add(project=team.project, user=carol, role=Role.MEMBER)
    make_ready_version(team.project, name="prefs", kind="preference", rows=ROWS, user=team.owner)
    contexts = [browser.new_context(viewport={"width": 1280, "height": 900}) for _ in range(3)]
    try:
        ann, bob, owner = (log_in(context, base, name)
                           for context, name in zip(contexts, ["alpha-teammate", "carol", "alpha-owner"]))
        owner.goto(f"{base}/p/alpha/")
        owner.locator("nav.subnav").get_by_role("link", name="Review").click()
        owner.get_by_role("link", name="New campaign", exact=True).click()
        owner.fill("#id_name", "pass 1")
        owner.select_option("#id_source_version", label=f"{isolated('prefs')} v1 (3 rows)")
        owner.fill("#id_guidelines", "Pick the **right** one.")
        owner.fill("#id_required_reviews", "2")
        owner.get_by_label("alpha-teammate").check()
        owner.get_by_label("carol").check()
        with owner.expect_navigation():
            owner.get_by_role("button", name="Create campaign").click()
        # The default worker loads the items; the page refreshes itself until they are in.
        owner.locator(".campaign-loading").wait_for(state="detached", timeout=30_000)
        assert owner.locator(".status-counts li").last.inner_text() == "of 3 items"
        campaign = Campaign.objects.get(name="pass 1")
        review_url = f"{base}/p/alpha/review/{campaign.public_id}/next/"
        ann.goto(review_url)
        bob.goto(review_url)
        assert ann.locator(".guidelines strong").inner_text() == "right"
        screenshot(ann, "review-item")
        # Both review at the same time: the queue gives them different items first.
        assert ann.locator(".prompt .text").inner_text() != bob.locator(".prompt .text").inner_text()
        for _ in range(3):
            prompt = ann.locator(".prompt .text").inner_text()
            answer_with_keys(ann, pick="right", edit="right answer 3, edited" if prompt == "Question 3?" else None)
            prompt = bob.locator(".prompt .text").inner_text()
            answer_with_keys(bob, pick="wrong" if prompt == "Question 2?" else "right")
        for page in (ann, bob):
            assert page.locator(".queue-empty").is_visible()
            assert "recorded" in page.locator(".messages").inner_text()
        assert Review.objects.count() == 6
        assert Review.objects.get(reviewer=team.teammate, item__sequence=3).edited_a == "right answer 3, edited"

        owner.goto(f"{base}/p/alpha/review/{campaign.public_id}/")
        assert owner.locator(".status-counts .status-complete b").inner_text() == "2"
        assert owner.locator(".status-counts .status-conflict b").inner_text() == "1"
        assert owner.locator(".review-progress .bar").get_attribute("aria-valuenow") == "67"
        screenshot(owner, "review-campaign")
        owner.get_by_role("link", name="Conflicts (1)").click()
        conflict = owner.locator("article.conflict")
        assert conflict.locator("h2").inner_text() == "Item 2"
        assert conflict.locator("table.answers tbody tr").count() == 2
        screenshot(owner, "review-conflicts")
        with owner.expect_navigation():
            conflict.get_by_role("button", name="A better").click()
        assert "No conflicts to resolve." in owner.locator("main").inner_text()
        assert Item.objects.get(sequence=2).status == ItemStatus.COMPLETE

        owner.goto(f"{base}/p/alpha/review/{campaign.public_id}/")
        owner.fill("#id_dataset_name", "prefs reviewed")
        with owner.expect_navigation():
            owner.get_by_role("button", name="Export").click()
        # The worker writes the version; the campaign page refreshes itself until it is listed.
        owner.locator("table.exports").get_by_role("link", name="prefs reviewed v1").click(timeout=30_000)
        owner.locator(".page-head .status-ready").wait_for(timeout=30_000)  # validated by the worker
        assert "prefs reviewed" in owner.locator(".page-head h1").inner_text()
        screenshot(owner, "review-export")
    finally:
        for context in contexts:
            context.close()
    export = campaign.exports.get()
    rows = [json.loads(line) for line in export.version.absolute_path.read_text().splitlines()]
    assert [(row["prompt"], row["chosen"], row["rejected"], row["review"]["resolved"]) for row in rows] == [
        ("Question 1?", "right answer 1", "wrong answer 1", False),
        ("Question 2?", "right answer 2", "wrong answer 2", True),
        ("Question 3?", "right answer 3, edited", "wrong answer 3", False),
    ]
    assert export.reviewers == ["alpha-teammate", "carol"]


def test_long_responses_scroll_in_their_boxes_and_the_answers_stay_in_view(browser, live_server):
    """A 30,000-character response made the reviewing page 17,000 px tall, its answer buttons far below."""
    from webapp.review import services as review_services

    team = make_team()
    campaign = review_services.campaign_create(project=team.project, name="long", guidelines="", required_reviews=1,
                                               reviewers=[team.owner], source_version=None, user=team.owner)
    review_services.item_add(campaign=campaign, prompt="Q? " * 2000, response_a="L" * 30_000, response_b="short",
                             source="arena")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = log_in(context, live_server.url, team.owner.username)
        page.goto(f"{live_server.url}/p/alpha/review/{campaign.public_id}/next/")
        box = page.locator(".response-first .text") if "L" * 100 in page.locator(
            ".response-first .text").inner_text() else page.locator(".response-second .text")
        assert box.evaluate("text => text.scrollHeight > text.clientHeight")  # it scrolls in its place
        assert page.locator(".choices button").first.bounding_box()["y"] < 1.3 * 900  # a short scroll away
        assert page.evaluate("document.documentElement.scrollHeight") < 1.5 * 900
    finally:
        context.close()


def loaded(campaign: Campaign, workers) -> Campaign:
    """The campaign once the ``default`` worker has made its items (``campaign_create`` queued the load).
    The tests used to call ``campaign_load_items`` as well, which raced a worker left running by an earlier
    test: the later load's start deleted the items the other had just made (CI: "ready, 0 items")."""
    return wait_for(lambda: Campaign.objects.filter(pk=campaign.pk, status=CampaignStatus.READY).first(),
                    workers=workers, what=f"campaign {campaign.name} to be loaded")


def reviewed_by_the_owner(team, rows, workers) -> Campaign:
    """A campaign "pass 1" on a preference version of ``rows`` that the owner reviews alone, its items loaded."""
    from webapp.review import services as review_services

    version = make_ready_version(team.project, name="prefs", kind="preference", rows=rows, user=team.owner)
    campaign = review_services.campaign_create(project=team.project, name="pass 1", guidelines="", required_reviews=1,
                                               reviewers=[team.owner], source_version=version, user=team.owner)
    loaded(campaign, workers)
    return campaign


def test_an_edit_that_blanks_a_response_is_refused_and_kept_to_correct(browser, live_server, default_worker):
    """QA: an edit that left a response empty was stored. The item comes back with the edit boxes open, what
    was typed in them, the reason under the emptied one and the cursor in it; corrected, the answer goes."""
    team = make_team()
    campaign = reviewed_by_the_owner(team, ROWS[:1], default_worker)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = log_in(context, live_server.url, team.owner.username)
        page.goto(f"{live_server.url}/p/alpha/review/{campaign.public_id}/next/")
        page.keyboard.press("e")
        page.locator("textarea[name=edited_first]").fill("   ")
        page.locator("textarea[name=edited_second]").fill("kept as typed")
        page.keyboard.press("Escape")
        with page.expect_navigation():
            page.keyboard.press("1")
        error = page.locator(".response-first small.error")
        assert error.inner_text() == ("your edit leaves the first response empty: type the text it should have, "
                                      "or put its original text back to leave it unedited")
        first_box = page.locator("textarea[name=edited_first]")
        assert first_box.evaluate("element => element === document.activeElement")
        assert page.locator("textarea[name=edited_second]").input_value() == "kept as typed"
        assert not Review.objects.exists()
        screenshot(page, "review-blank-edit")
        first_box.fill("a better first answer")
        page.keyboard.press("Escape")
        with page.expect_navigation():
            page.keyboard.press("1")
        assert "Item 1 edited and recorded." in page.locator(".messages").inner_text()
        review = Review.objects.get()
        assert {review.edited_a, review.edited_b} == {"a better first answer", "kept as typed"}
    finally:
        context.close()


def test_reloading_the_page_that_asks_to_change_a_resolution_sends_nothing(browser, live_server, default_worker):
    """QA: the page asking to confirm a change of resolution was the answer to the POST, so reloading it made
    the browser offer to send the form again. It is a page of its own: a reload asks again, changes nothing."""
    from webapp.review import services as review_services

    team = make_team()
    alice = make_user("alice")
    project_services.membership_add(project=team.project, user=alice, role=Role.OWNER)
    version = make_ready_version(team.project, name="prefs", kind="preference", rows=ROWS[:1], user=team.owner)
    campaign = review_services.campaign_create(project=team.project, name="pass 1", guidelines="", required_reviews=2,
                                               reviewers=[team.owner, team.teammate], source_version=version,
                                               user=team.owner)
    loaded(campaign, default_worker)
    item = campaign.items.get()
    for user, label in ((team.owner, "a"), (team.teammate, "b")):
        shown_first = review_services.shown_first_for(item_public_id=item.public_id, user_id=user.pk)
        review_services.review_submit(item=item, user=user, choice="first" if shown_first == label else "second")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = log_in(context, live_server.url, team.owner.username)
        page.goto(f"{live_server.url}/p/alpha/review/{campaign.public_id}/conflicts/")
        review_services.conflict_resolve(item=item, label="a", user=alice, shown_label="")  # meanwhile, elsewhere
        with page.expect_navigation():
            page.locator("article.conflict").get_by_role("button", name="B better").click()
        assert page.url.endswith(f"/conflicts/{item.public_id}/resolve/?label=b")
        heading = "Item 1 is already resolved as A better by alice"
        assert page.locator(".resolve-confirm h2").inner_text() == heading
        reloaded = page.reload()
        assert (reloaded.request.method, reloaded.status) == ("GET", 409)
        assert page.locator(".resolve-confirm h2").inner_text() == heading
        item.refresh_from_db()
        assert (item.resolved_label, item.resolved_by) == ("a", alice)
        with page.expect_navigation():
            page.get_by_role("button", name="Change to B better").click()
        assert "Item 1 resolved: B better." in page.locator(".messages").inner_text()
        item.refresh_from_db()
        assert (item.resolved_label, item.resolved_by) == ("b", team.owner)
    finally:
        context.close()


def edited_differently(team, carol, texts, workers) -> tuple[Campaign, Item]:
    """A campaign "pass 1" on one preference row that ``team.teammate`` and ``carol`` review, each editing response A
    (its ``texts``, in that order), and its item: a conflict of their edits for an owner to resolve."""
    from webapp.review import services as review_services

    version = make_ready_version(team.project, name="prefs", kind="preference", rows=ROWS[:1], user=team.owner)
    campaign = review_services.campaign_create(project=team.project, name="pass 1", guidelines="", required_reviews=2,
                                               reviewers=[team.teammate, carol], source_version=version,
                                               user=team.owner)
    loaded(campaign, workers)
    item = campaign.items.get()
    for user, text in zip((team.teammate, carol), texts, strict=True):
        shown_first = review_services.shown_first_for(item_public_id=item.public_id, user_id=user.pk)
        review_services.review_submit(item=item, user=user, choice="first" if shown_first == "a" else "second",
                                      **{"edited_first" if shown_first == "a" else "edited_second": text})
    return campaign, item


def test_the_owner_gives_the_final_text_of_a_response_two_reviewers_edited_differently(browser, live_server,
                                                                                       default_worker):
    """Two reviewers' different edits of one response were exported as the latest, a disagreement nobody saw. The
    item is a conflict: its page shows both texts (as text) with who made them, and its label buttons send nothing
    until the owner picks one of them, the original, or writes the final text."""
    team = make_team()
    carol = make_user("carol")
    project_services.membership_add(project=team.project, user=carol, role=Role.MEMBER)
    campaign, item = edited_differently(team, carol, ("<b>right</b> answer 1", "the right answer: 1"), default_worker)
    item.refresh_from_db()
    assert item.status == ItemStatus.CONFLICT
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = log_in(context, live_server.url, team.owner.username)
        page.goto(f"{live_server.url}/p/alpha/review/{campaign.public_id}/conflicts/")
        final = page.locator("fieldset.final-text[data-side=a]")
        assert final.locator("legend").inner_text() == "Reviewers edited response A differently: its final text"
        assert [label.inner_text() for label in final.locator("label.pick").all()] == [
            "<b>right</b> answer 1\nedited by alpha-teammate", "the right answer: 1\nedited by carol",
            "the original, unedited", "write the final text:"]
        assert page.locator("fieldset.final-text[data-side=b]").count() == 0
        page.get_by_role("button", name="A better").click()  # nothing picked: the browser asks, sends nothing
        assert page.url.endswith("/conflicts/")
        item.refresh_from_db()
        assert (item.status, item.resolved_label) == (ItemStatus.CONFLICT, "")
        screenshot(page, "review-edit-conflict")
        final.get_by_label("write the final text:").check()
        final.get_by_label("The final text of response A").fill("right answer 1\n(the owner's words)")
        with page.expect_navigation():
            page.get_by_role("button", name="A better").click()
        assert "Item 1 resolved: A better." in page.locator(".messages").inner_text()
        item.refresh_from_db()
        assert (item.status, item.resolved_label, item.resolved_a) == (
            ItemStatus.COMPLETE, "a", "right answer 1\n(the owner's words)")
    finally:
        context.close()


def test_an_owners_final_text_survives_a_refusal_and_a_resolution_made_meanwhile(browser, live_server, default_worker):
    """The final text an owner wrote was lost twice over: a resolution refused (a blank text) went back to the
    conflicts page with the box empty, and one resolved meanwhile by another owner left only a notice (the same
    label) or a page whose change kept the other's text. The box comes back holding what was typed, and the page
    asking about the resolution made meanwhile shows the other's text beside the owner's, exactly as typed (leading
    line break and trailing spaces too), through a reload; confirming resolves with it."""
    from webapp.review import services as review_services

    team = make_team()
    carol, alice = make_user("carol"), make_user("alice")
    project_services.membership_add(project=team.project, user=carol, role=Role.MEMBER)
    project_services.membership_add(project=team.project, user=alice, role=Role.OWNER)
    campaign, item = edited_differently(team, carol, ("right answer one", "the right answer: 1"), default_worker)
    written = "\nright answer 1 <b>as I wrote it</b>  "
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = log_in(context, live_server.url, team.owner.username)
        page.goto(f"{live_server.url}/p/alpha/review/{campaign.public_id}/conflicts/")
        final = page.locator("fieldset.final-text[data-side=a]")
        final.get_by_label("write the final text:").check()
        final.get_by_label("The final text of response A").fill(" \n ")
        with page.expect_navigation():
            page.get_by_role("button", name="A better").click()
        # Refused in the words the page asking to change a resolution uses for a box cleared.
        assert "the final text of response A is blank" in final.locator(".error").inner_text()
        assert final.get_by_label("write the final text:").is_checked()
        assert final.get_by_label("The final text of response A").input_value() == " \n "
        final.get_by_label("The final text of response A").fill(written)
        review_services.conflict_resolve(item=item, label="a", user=alice, shown_label="",  # meanwhile, elsewhere
                                         texts={"a": "right answer one"})
        with page.expect_navigation():
            page.get_by_role("button", name="A better").click()
        assert page.url.endswith(f"/conflicts/{item.public_id}/resolve/?label=a")
        for _reload in range(2):
            assert page.locator(".resolve-confirm h2").inner_text() == "Item 1 is already resolved as A better by alice"
            assert page.locator(".their-text[data-side=a]").inner_text() == "right answer one"
            assert page.get_by_label("Your final text of response A").input_value() == written
            item.refresh_from_db()
            assert (item.resolved_a, item.resolved_by) == ("right answer one", alice)
            page.reload()
        with page.expect_navigation():
            page.get_by_role("button", name="Change to your text").click()
        assert "Item 1 resolved: A better." in page.locator(".messages").inner_text()
        item.refresh_from_db()
        assert (item.resolved_label, item.resolved_a, item.resolved_by) == ("a", written, team.owner)
    finally:
        context.close()


def test_an_owners_final_text_survives_the_item_going_back_to_review_meanwhile(browser, live_server, default_worker):
    """Another owner raised the reviews per item while this one was writing a conflict's final text: the resolution
    was refused with a redirect saying "item 1 is in review, not in conflict; only conflicts are resolved" and the
    text was gone. The item comes back with the text as typed, to copy, a note saying why and what becomes of it,
    and no label buttons to be refused again."""
    from webapp.review import services as review_services

    team = make_team()
    carol = make_user("carol")
    project_services.membership_add(project=team.project, user=carol, role=Role.MEMBER)
    campaign, item = edited_differently(team, carol, ("right answer one", "the right answer: 1"), default_worker)
    written = "right answer 1 <b>as I wrote it</b>"
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = log_in(context, live_server.url, team.owner.username)
        page.goto(f"{live_server.url}/p/alpha/review/{campaign.public_id}/conflicts/")
        final = page.locator("fieldset.final-text[data-side=a]")
        final.get_by_label("write the final text:").check()
        final.get_by_label("The final text of response A").fill(written)
        review_services.campaign_update(campaign=campaign, guidelines="", required_reviews=3,  # meanwhile, elsewhere
                                        reviewers=[team.teammate, carol, team.owner])
        with page.expect_navigation():
            page.get_by_role("button", name="A better").click()
        assert page.locator(".messages").inner_text() == (
            "Item 1 is not resolved: see why below (what you chose is kept there to copy).")
        card = page.locator(f"article.conflict[data-item={item.public_id}]")
        assert card.get_by_role("alert").inner_text() == (
            "Item 1 is not in conflict: it is in review, for 3 answers (the campaign's reviews per item; an owner may "
            "have raised them since this page was loaded). It comes to the conflicts page if its reviewers disagree "
            "once they have answered.")
        assert final.get_by_label("The final text of response A").input_value() == written
        assert card.get_by_role("button").count() == 0
        item.refresh_from_db()
        assert (item.status, item.resolved_label) == (ItemStatus.IN_REVIEW, "")
    finally:
        context.close()


def test_the_letter_keys_answer_with_caps_lock_on(browser, live_server, default_worker):
    """QA: with Caps Lock on, 1 and 2 answered but t, b, s and e did nothing at all (the page looked for the
    key "t" and was sent "T"); the letters now answer in either case."""
    team = make_team()
    campaign = reviewed_by_the_owner(team, ROWS[:2], default_worker)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = log_in(context, live_server.url, team.owner.username)
        page.goto(f"{live_server.url}/p/alpha/review/{campaign.public_id}/next/")
        with page.expect_navigation():
            page.keyboard.press("T")
        assert page.locator(".messages").inner_text() == "Item 1 recorded."
        page.keyboard.press("E")
        assert page.locator("textarea[name=edited_first]").evaluate("element => element === document.activeElement")
        page.keyboard.press("Escape")
        with page.expect_navigation():
            page.keyboard.press("S")
        assert [review.choice for review in Review.objects.filter(item__campaign=campaign).order_by("item__sequence")
                ] == ["tie", "skip"]
    finally:
        context.close()


def test_a_generating_campaigns_confirmations_stay_open_while_its_page_follows_it(browser, live_server,
                                                                                   transactional_db):
    """QA: the campaign page reloaded itself every 3 s while its answers were generated, which closed an open
    "Delete…" under the owner's pointer. It now reloads only while no confirmation is open; "Stop and delete"
    then deletes the campaign and stops its generation."""
    from datetime import timedelta

    from django.utils import timezone

    from webapp.review import services

    team = make_team()
    campaign = services.campaign_create(project=team.project, name="big mistake", guidelines="", required_reviews=1,
                                        reviewers=[team.teammate], source_version=None, user=team.owner)
    # A generation under way (no serve worker here: what it would do next is not the question).
    Campaign.objects.filter(pk=campaign.pk).update(
        status=CampaignStatus.GENERATING, generation_progress_at=timezone.now() + timedelta(hours=1),
        generation={"model_a": {"label": "falcon"}, "model_b": {"label": "heron"},
                    "prompts": {"label": "questions v1", "count": 5000},
                    "sampling": {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "max_new_tokens": 256, "seed": 0}})
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    refused = []
    try:
        owner = log_in(context, live_server.url, "alpha-owner")
        owner.on("console", lambda message: refused.append(message.text)
                 if "Content Security Policy" in message.text else None)
        owner.goto(f"{live_server.url}/p/alpha/review/{campaign.public_id}/")
        with owner.expect_navigation():  # it follows the generation: nothing is open
            pass
        owner.locator("#delete-confirm summary").click()
        owner.evaluate("window.loadedOnce = true")
        owner.wait_for_timeout(7_000)  # two of its reload periods
        assert owner.evaluate("window.loadedOnce === true"), "the page reloaded with Delete… open"
        assert owner.locator("#delete-confirm").get_attribute("open") is not None
        with owner.expect_navigation():
            owner.get_by_role("button", name="Stop and delete big mistake").click()
        assert owner.url == f"{live_server.url}/p/alpha/review/"
        assert "stopping its generation" in owner.locator(".messages").inner_text()
        assert not Campaign.objects.filter(pk=campaign.pk).exists()
        assert refused == []
    finally:
        context.close()
