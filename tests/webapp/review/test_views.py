"""Review pages with an owner, a reviewer (teammate), a viewer and an outsider."""

import re
from datetime import datetime, timezone

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from tests.webapp.factories import form_token, make_ready_version
from tests.webapp.review.conftest import answer, create_loaded, expire_leases, in_conflict_with_a_second_owner
from webapp.core.bidi import isolated
from webapp.core.submissions import TOKEN_FIELD
from webapp.review import services
from webapp.review.models import Campaign, Export, Item, ItemStatus, Lease, Review
from worker.tasks.datasets import validate_dataset_version


def url(name, campaign, *extra):
    return reverse(f"review:{name}", args=[campaign.project.slug, campaign.public_id, *extra])


def test_everyone_in_the_project_reads_the_campaign(campaign, team, client_for):
    for user in (team.owner, team.teammate, team.viewer):
        response = client_for(user).get(url("detail", campaign))
        assert response.status_code == 200
        assert b"pass 1" in response.content and b"<strong>correct</strong>" in response.content
        response = client_for(user).get(url("items", campaign))
        assert response.status_code == 200 and b"Capital of France?" in response.content


def test_the_position_bias_reads_as_one_figure(campaign, team, client_for):
    """Its note sat after the figure, so a fresh campaign read 'no votes yet 0.5 = no bias'."""
    page = client_for(team.viewer).get(f"/p/alpha/review/{campaign.public_id}/").content.decode()
    figure = page.split('<dd class="figure-position">')[1].split("</dd>")[0]
    assert figure.strip() == '<span class="muted">no votes yet</span>'
    assert "0.5 = no bias)</span></dt>" in page


def test_it_requires_access(campaign, team, client_for):
    outsider = client_for(team.outsider)
    for name in ("detail", "items", "next", "conflicts", "settings"):
        assert outsider.get(url(name, campaign)).status_code == 404
    assert outsider.get(reverse("review:list", args=[team.project.slug])).status_code == 404
    assert outsider.post(url("export", campaign), {"dataset_name": "x"}).status_code == 404
    item = Item.objects.get(campaign=campaign, sequence=1)
    assert outsider.post(url("resolve", campaign, item.public_id), {"label": "a"}).status_code == 404
    # A campaign id from another project is a 404 too.
    elsewhere = reverse("review:detail", args=[team.outsider_project.slug, campaign.public_id])
    assert outsider.get(elsewhere).status_code == 404


def test_a_viewer_cannot_review(campaign, team, client_for):
    viewer = client_for(team.viewer)
    assert viewer.get(url("next", campaign)).status_code == 403
    item = Item.objects.get(campaign=campaign, sequence=1)
    assert viewer.post(url("next", campaign), {"item": item.public_id, "choice": "first"}).status_code == 403
    assert not Review.objects.exists()


def test_a_member_who_is_not_a_reviewer_cannot_review(campaign, team, client_for):
    campaign = services.campaign_update(campaign=campaign, guidelines="", required_reviews=2,
                                        reviewers=[team.owner]).campaign
    assert client_for(team.teammate).get(url("next", campaign)).status_code == 403


def test_only_owners_manage_campaigns(campaign, team, client_for, preference_version):
    member = client_for(team.teammate)
    assert member.get(reverse("review:create", args=[team.project.slug])).status_code == 403
    assert member.get(url("settings", campaign)).status_code == 403
    assert member.get(url("conflicts", campaign)).status_code == 403
    assert member.post(url("export", campaign), {"dataset_name": "x"}).status_code == 403
    item = Item.objects.get(campaign=campaign, sequence=1)
    assert member.post(url("resolve", campaign, item.public_id), {"label": "a"}).status_code == 403


def test_the_owner_creates_a_campaign(team, carol, client_for, preference_version):
    owner = client_for(team.owner)
    page = owner.get(reverse("review:create", args=[team.project.slug]))
    assert f"{isolated('prefs')} v1 (4 rows)" in page.content.decode()
    assert b"alpha-viewer" not in page.content, "viewers are not offered as reviewers"
    response = owner.post(reverse("review:create", args=[team.project.slug]), {
        "name": "round 2", "source_version": preference_version.pk, "guidelines": "Be fair.",
        "required_reviews": 2, "reviewers": [team.teammate.pk, carol.pk]})
    campaign = Campaign.objects.get(name="round 2")
    assert response.status_code == 302 and response.url == url("detail", campaign)
    assert campaign.status == "loading"
    page = owner.get(url("detail", campaign))
    assert b"Loading items from <bdi>prefs v1</bdi>" in page.content and b'http-equiv="refresh"' in page.content
    assert b"still loading" in client_for(team.teammate).get(url("next", campaign)).content
    assert client_for(team.teammate).post(url("load", campaign)).status_code == 403
    assert owner.post(url("load", campaign)).status_code == 302, "the owner may queue the load again"
    campaign = services.campaign_load_items(campaign_id=campaign.pk)
    assert campaign.items.count() == 4
    assert set(campaign.reviewers.values_list("username", flat=True)) == {"alpha-teammate", "carol"}


def test_preference_rows_whose_answers_are_the_same_are_left_out_and_counted(team, carol, client_for):
    """QA: a preference row whose chosen and rejected are the same answer became an item: nothing to prefer, and
    its export would teach that an answer beats itself. Generated campaigns left such pairs out; rows of a
    dataset version are left out too (whitespace around the text aside, as there), and the page counts them."""
    rows = [{"prompt": "2+2?", "chosen": "4", "rejected": "5"},
            {"prompt": "Same", "chosen": "Yes.", "rejected": " Yes.\n"},
            {"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "Hello"}],
             "rejected": [{"role": "assistant", "content": "Hello"}]},
            {"prompt": "Spell cat", "chosen": "c-a-t", "rejected": "k-a-t"}]
    version = make_ready_version(team.project, name="mixed", kind="preference", rows=rows, user=team.owner)
    campaign = create_loaded(project=team.project, name="mixed pass", guidelines="", required_reviews=1,
                             reviewers=[carol], source_version=version, user=team.owner)
    assert campaign.status == "ready"
    assert list(campaign.items.order_by("sequence").values_list("sequence", "source_row")) == [(1, 1), (2, 4)]
    assert campaign.identical_rows == 2
    page = client_for(team.owner).get(url("detail", campaign)).content.decode()
    assert "(2 rows left out: their chosen and rejected answers are the same)" in page
    all_same = make_ready_version(team.project, name="same", kind="preference", rows=rows[1:3], user=team.owner)
    campaign = create_loaded(project=team.project, name="same pass", guidelines="", required_reviews=1,
                             reviewers=[carol], source_version=all_same, user=team.owner)
    assert campaign.status == "failed" and not campaign.items.exists()
    assert campaign.load_error == (f"every one of the 2 rows of {isolated('same v1')} has the same chosen and rejected "
                                   "answer, which leaves nothing to review; choose a version whose rows differ")


def test_the_same_campaign_sent_twice_is_created_once(team, carol, client_for, preference_version):
    owner = client_for(team.owner)
    page = owner.get(reverse("review:create", args=[team.project.slug])).content.decode()
    form = {"name": "round 2", "source_version": preference_version.pk, "guidelines": "Be fair.",
            "required_reviews": 2, "reviewers": [team.teammate.pk, carol.pk],
            TOKEN_FIELD: form_token(page)}
    first = owner.post(reverse("review:create", args=[team.project.slug]), form)
    second = owner.post(reverse("review:create", args=[team.project.slug]), form)
    campaign = Campaign.objects.get()
    assert first.status_code == second.status_code == 302 and first.url == second.url == url("detail", campaign)


def test_the_create_page_says_where_a_preference_dataset_comes_from_when_there_is_none(team, client_for):
    """The form offered an empty 'Preference dataset version' list, which the browser refused to send, with
    no word of what was missing or where to get one."""
    create_url = reverse("review:create", args=[team.project.slug])
    page = client_for(team.owner).get(create_url).content.decode()
    assert "has no ready preference dataset version to review yet" in page
    assert f'<a href="{reverse("datasets:upload", args=[team.project.slug])}">Upload one</a>' in page
    assert f'href="{reverse("review:generate", args=[team.project.slug])}"' in page
    make_ready_version(team.project, name="one pair", kind="preference",
                       rows=[{"prompt": "2+2?", "chosen": "4", "rejected": "5"}])
    page = client_for(team.owner).get(create_url).content.decode()
    assert "no ready preference dataset version" not in page
    assert f"{isolated('one pair')} v1 (1 row)</option>" in page


def test_the_create_page_names_a_preference_version_still_being_checked(team, client_for):
    """A newcomer who uploaded preference pairs and went straight to New review campaign was told to upload one:
    the page did not say that the upload was there, still being checked."""
    from webapp.datasets.models import VersionStatus

    version = make_ready_version(team.project, name="pairs <b>v2</b>", kind="preference",
                                 rows=[{"prompt": "2+2?", "chosen": "4", "rejected": "5"}])
    version.status = VersionStatus.VALIDATING
    version.save(update_fields=["status"])
    make_ready_version(team.project, name="chats", kind="sft")  # another kind: not named
    page = client_for(team.owner).get(reverse("review:create", args=[team.project.slug])).content.decode()
    link = reverse("datasets:version", args=[team.project.slug, version.dataset.public_id, version.number])
    assert (f'<a href="{link}">{isolated("pairs &lt;b&gt;v2&lt;/b&gt;")} v1</a> is being checked: it is offered here '
            "once it is ready (reload this page)." in page)
    assert "chats" not in page.split('id="no-sources"')[1].split("</p>")[0]


def test_it_rejects_a_campaign_without_reviewers(team, client_for, preference_version):
    response = client_for(team.owner).post(reverse("review:create", args=[team.project.slug]), {
        "name": "round 2", "source_version": preference_version.pk, "required_reviews": 2})
    # It says what to do, not Django's 'This field is required.'
    assert response.status_code == 400 and b"This field is required" not in response.content
    assert b"Tick at least one reviewer: the items wait in the queues of those ticked." in response.content


def test_a_reviewer_ticked_who_can_no_longer_review_is_refused_in_words(campaign, team, carol, client_for,
                                                                       preference_version):
    """QA: an owner ticked a member on the New campaign (or Settings) page while another owner made that member
    a viewer or removed them: the page answered "Select a valid choice. 5 is not one of the available choices.",
    an id the owner never sees. It now says what happened and what to do."""
    from webapp.projects import services as project_services
    from webapp.projects.models import Membership, Role

    project_services.membership_set_role(membership=Membership.objects.get(project=team.project, user=carol),
                                         role=Role.VIEWER)
    owner = client_for(team.owner)
    for address, form in ((reverse("review:create", args=[team.project.slug]),
                           {"name": "round 2", "source_version": preference_version.pk, "required_reviews": 1}),
                          (url("settings", campaign), {"guidelines": "", "required_reviews": 1})):
        response = owner.post(address, {**form, "reviewers": [team.teammate.pk, carol.pk]})
        page = response.content.decode()
        assert response.status_code == 400 and "is not one of the available choices" not in page
        assert ("A reviewer you ticked can no longer review: they left the project, were made a viewer or were "
                "deactivated since the page was shown. Tick the reviewers again from the list as it is now.") in page
        assert "carol" not in page.split('id="id_reviewers"')[1].split("</div>\n</div>")[0]
    assert not Campaign.objects.filter(name="round 2").exists()
    assert set(campaign.reviewers.values_list("username", flat=True)) == {"alpha-teammate"}


def test_a_new_campaign_asks_for_no_more_reviews_per_item_than_the_project_has_reviewers(team, client_for):
    """A project whose owner works alone got 2 reviews per item by default, and the new campaign opened
    saying that no item could ever be complete."""
    from tests.webapp.factories import make_user
    from webapp.projects import services as project_services

    solo = project_services.project_create(name="Solo", slug="solo", owner=make_user("solo-owner"))
    for page_name in ("review:create", "review:generate"):
        alone = client_for(solo.memberships.get().user).get(reverse(page_name, args=["solo"])).content.decode()
        assert 'name="required_reviews" value="1"' in alone, page_name
        together = client_for(team.owner).get(reverse(page_name, args=[team.project.slug])).content.decode()
        assert 'name="required_reviews" value="2"' in together, page_name


def test_a_new_campaign_starts_with_the_team_ticked_as_reviewers(team, carol, client_for):
    """A new campaign's form ticked no one, so even an owner working alone was sent back to tick themselves;
    the settings page still shows the campaign's own reviewers."""
    import re

    for page_name in ("review:create", "review:generate"):
        page = client_for(team.owner).get(reverse(page_name, args=[team.project.slug])).content.decode()
        boxes = re.findall(r'<input type="checkbox" name="reviewers"[^>]*>', page)
        assert len(boxes) == 3 and all("checked" in box for box in boxes), (page_name, boxes)


def test_a_reviewer_reviews_with_the_form(campaign, team, client_for):
    reviewer = client_for(team.teammate)
    page = reviewer.get(url("next", campaign))
    item = page.context["item"]
    assert item.sequence == 1 and b'data-key="1"' in page.content
    response = reviewer.post(url("next", campaign), {"item": item.public_id, "choice": "tie", "comment": "same"})
    assert response.status_code == 302 and response.url == url("next", campaign)
    review = Review.objects.get(item=item, reviewer=team.teammate)
    assert (review.label, review.comment, review.edited_a, review.edited_b) == ("tie", "same", None, None)
    assert reviewer.get(url("next", campaign)).context["item"].sequence == 2


def test_a_skip_reads_as_skipped_not_recorded(campaign, team, client_for):
    """'s' said 'Item 1 recorded.', as an answer does, though a skip counts toward nothing."""
    reviewer = client_for(team.teammate)
    item = reviewer.get(url("next", campaign)).context["item"]
    page = reviewer.post(url("next", campaign), {"item": item.public_id, "choice": "skip"}, follow=True)
    assert "Item 1 skipped." in page.content.decode() and "recorded" not in page.content.decode()
    page = reviewer.post(url("next", campaign), {"item": page.context["item"].public_id, "choice": "first"}, follow=True)
    assert "Item 2 recorded." in page.content.decode()


def test_an_edit_through_the_form_is_stored_beside_the_original(campaign, team, client_for):
    reviewer = client_for(team.teammate)
    page = reviewer.get(url("next", campaign))
    item = page.context["item"]
    reviewer.post(url("next", campaign), {"item": item.public_id, "choice": "first",
                                          "edited_first": "Four.", "edited_second": page.context["second_text"]})
    review = Review.objects.get(item=item, reviewer=team.teammate)
    shown_first = review.shown_first
    assert (review.edited_a if shown_first == "a" else review.edited_b) == "Four."
    assert (review.edited_b if shown_first == "a" else review.edited_a) is None, "an unchanged text is no edit"


def test_edit_boxes_opened_but_left_as_they_were_read_as_no_edit(campaign, team, client_for):
    """QA: a reviewer who pressed e, changed nothing and answered was told "Item 1 edited and recorded.",
    though no edit was stored (an unchanged text is none)."""
    reviewer = client_for(team.teammate)
    page = reviewer.get(url("next", campaign))
    answered = reviewer.post(url("next", campaign), {
        "item": page.context["item"].public_id, "choice": "first", "edited_first": page.context["first_text"],
        "edited_second": page.context["second_text"]}, follow=True).content.decode()
    assert "Item 1 recorded." in answered and "edited" not in answered.split('class="messages"')[1].split("</ul>")[0]
    page = reviewer.get(url("next", campaign))
    answered = reviewer.post(url("next", campaign), {
        "item": page.context["item"].public_id, "choice": "skip", "edited_first": "Better.",
        "edited_second": page.context["second_text"]}, follow=True).content.decode()
    # A skip carries no edit: what was typed is dropped, and the message says so.
    assert "Item 2 skipped; your edits were dropped, as a skip carries none." in answered
    assert Review.objects.get(item=page.context["item"], reviewer=team.teammate).edited_a is None


def test_it_rejects_an_edit_that_blanks_a_response(campaign, team, client_for):
    """QA: an edit that left a response empty or only whitespace was accepted and stored. It is refused on
    the item's page, shown again with what was typed and the reason under the box it concerns; nothing is
    saved and the item stays the reviewer's."""
    reviewer = client_for(team.teammate)
    page = reviewer.get(url("next", campaign))
    item = page.context["item"]
    response = reviewer.post(url("next", campaign), {
        "item": item.public_id, "choice": "first", "edited_first": "Four, <b>surely</b>.",
        "edited_second": " \r\n ", "comment": "close <call>"})
    body = response.content.decode()
    assert response.status_code == 400 and response.context["item"] == item
    assert ('<small class="error" id="edited_second-error">your edit leaves the second response empty: type the '
            'text it should have, or put its original text back to leave it unedited</small>') in body
    assert 'class="review-form editing"' in body and " disabled hidden" not in body
    assert ">\nFour, &lt;b&gt;surely&lt;/b&gt;.</textarea>" in body
    assert 'aria-describedby="edited_second-error" autofocus>\n \r\n </textarea>' in body
    assert ">\nclose &lt;call&gt;</textarea>" in body
    assert not Review.objects.exists()
    item.refresh_from_db()
    assert item.status == ItemStatus.PENDING
    assert list(item.leases.values_list("reviewer", flat=True)) == [team.teammate.pk]
    assert reviewer.get(url("next", campaign)).context["item"] == item


def test_a_reviewer_never_sees_another_answer_before_their_own(campaign, team, carol, client_for):
    item = Item.objects.get(campaign=campaign, sequence=1)
    answer(item, carol, "a", comment="carol-secret-comment")
    page = client_for(team.teammate).get(url("next", campaign))
    assert page.context["item"] == item
    assert b"carol-secret-comment" not in page.content and b"carol" not in page.content


def test_review_text_is_escaped(team, carol, client_for):
    hostile = "<script>window.pwned=1</script><img src=x onerror=alert(1)>"
    version = make_ready_version(team.project, name="hostile", kind="preference", rows=[
        {"prompt": hostile, "chosen": hostile, "rejected": [{"role": "assistant", "content": hostile}]}])
    campaign = create_loaded(
        project=team.project, name="hostile", user=team.owner, source_version=version, required_reviews=2,
        reviewers=[team.teammate, carol],
        guidelines="**Bold** <script>alert(1)</script> [x](javascript:alert(1)) <img src=x onerror=alert(1)>")
    item = campaign.items.get()
    answer(item, team.teammate, "a", comment=hostile)
    answer(item, carol, "b", comment=hostile)
    owner, reviewer = client_for(team.owner), client_for(team.teammate)
    pages = [owner.get(url("detail", campaign)), owner.get(url("items", campaign)),
             owner.get(url("conflicts", campaign))]
    services.item_add(campaign=campaign, prompt=hostile, response_a=hostile, response_b=hostile, source="runs")
    pages.append(reviewer.get(url("next", campaign)))
    assert b"&lt;script&gt;window.pwned=1&lt;/script&gt;" in pages[3].content
    assert b"&lt;script&gt;window.pwned=1&lt;/script&gt;" in pages[2].content
    for page in pages:
        assert page.status_code == 200
        assert b"<script>window.pwned" not in page.content and b"<img src=x" not in page.content
        assert b"javascript:alert" not in page.content and b"<script>alert(1)" not in page.content
    assert b"<strong>Bold</strong>" in pages[0].content


def test_the_owner_resolves_a_conflict_and_exports(campaign, team, carol, client_for):
    item = Item.objects.get(campaign=campaign, sequence=2)
    answer(item, team.teammate, "a")
    answer(item, carol, "b")
    owner = client_for(team.owner)
    conflicts = owner.get(url("conflicts", campaign))
    assert [entry.item for entry in conflicts.context["conflicts"]] == [item]
    assert b"Capital of France?" in conflicts.content
    response = owner.post(url("resolve", campaign, item.public_id), {"label": "b"})
    assert response.status_code == 302
    item.refresh_from_db()
    assert (item.status, item.resolved_label) == (ItemStatus.COMPLETE, "b")
    response = owner.post(url("export", campaign), {"dataset_name": "clean prefs", "drop_ties": "on",
                                                    "drop_both_bad": "on", "apply_edits": "on"})
    assert response.status_code == 302 and response.url == url("detail", campaign)
    export = campaign.exports.get()
    detail = owner.get(url("detail", campaign))
    assert b"writing <bdi>clean prefs</bdi>" in detail.content and b'http-equiv="refresh"' in detail.content
    version = services.export_write(export_id=export.pk).version
    assert version.absolute_path.read_text().count("\n") == 1
    detail = owner.get(url("detail", campaign))
    assert b"<bdi>clean prefs</bdi> v1</a> <span class=\"badge status-in_review\">validating" in detail.content
    validate_dataset_version.apply(args=[version.pk]).get()
    detail = owner.get(url("detail", campaign))
    assert b"<bdi>clean prefs</bdi> v1" in detail.content and b'http-equiv="refresh"' not in detail.content


def test_the_default_export_name_of_a_long_campaign_name_fits_a_dataset_name(campaign, team, carol, client_for):
    """QA: "<campaign> reviewed" passed the 100 characters of a dataset name for a long campaign name, so the
    export form's own suggestion was refused."""
    Campaign.objects.filter(pk=campaign.pk).update(name="helpfulness and harmlessness pass " + "x" * 66)
    item = Item.objects.get(campaign=campaign, sequence=1)
    answer(item, team.teammate, "a")
    answer(item, carol, "a")
    owner = client_for(team.owner)
    suggested = owner.get(url("detail", campaign)).context["export_form"].initial["dataset_name"]
    assert len(suggested) == 100
    assert suggested == "helpfulness and harmlessness pass " + "x" * 56 + "… reviewed"
    response = owner.post(url("export", campaign), {"dataset_name": suggested, "drop_ties": "on"})
    assert response.status_code == 302 and campaign.exports.get().dataset_name == suggested


def test_reviewer_names_are_bidi_isolated_in_lists_and_labels(campaign, team, carol, client_for):
    """QA: a right-to-left username in the comma-joined reviewer lists and in the reviewer checkboxes' labels
    took the commas and the neighbouring names into its own direction."""
    carol.username = "\u05d3\u05e0\u05d4"  # Dana, in Hebrew
    carol.save(update_fields=["username"])
    item = Item.objects.get(campaign=campaign, sequence=1)
    answer(item, team.teammate, "a")
    answer(item, carol, "a")
    export = services.export_create(campaign=campaign, options=services.ExportOptions(dataset_name="clean prefs"),
                                    user=team.owner)
    services.export_write(export_id=export.pk)
    owner = client_for(team.owner)
    page = owner.get(url("detail", campaign)).content.decode()
    assert "<dd><bdi>alpha-teammate</bdi>, <bdi>\u05d3\u05e0\u05d4</bdi></dd>" in page  # the campaign's reviewers
    assert "<td><bdi>alpha-teammate</bdi>, <bdi>\u05d3\u05e0\u05d4</bdi></td>" in page  # the export's reviewers
    assert "<td><bdi>alpha-teammate</bdi> · <bdi>\u05d3\u05e0\u05d4</bdi></td>" in page  # a pair of reviewers
    assert "<td><bdi>alpha-owner</bdi></td>" in page  # who exported
    settings_page = owner.get(url("settings", campaign)).content.decode()
    assert f" {isolated(carol.username)}</label>" in settings_page


def exported_once_two_agree(campaign, team, carol):
    """The version an export of ``campaign`` named "clean prefs" writes once two reviewers agree on its first item."""
    item = Item.objects.get(campaign=campaign, sequence=1)
    answer(item, team.teammate, "a")
    answer(item, carol, "a")
    export = services.export_create(campaign=campaign, options=services.ExportOptions(dataset_name="clean prefs"),
                                    user=team.owner)
    return services.export_write(export_id=export.pk).version


def test_a_version_exported_from_a_campaign_links_back_to_it(campaign, team, carol, client_for):
    """QA: a dataset version written by a campaign's export did not say where it came from; its page and
    its API representation name the campaign, the page with a link to it."""
    from webapp.api.services import token_create

    version = exported_once_two_agree(campaign, team, carol)
    page = client_for(team.viewer).get(
        reverse("datasets:version", args=["alpha", version.dataset.public_id, version.number])).content.decode()
    assert f'<dt>From</dt><dd>review campaign <a href="{url("detail", campaign)}">pass 1</a></dd>' in page
    source = client_for(team.viewer).get(reverse("datasets:version", args=[
        "alpha", campaign.source_version.dataset.public_id, campaign.source_version.number])).content.decode()
    assert "review campaign" not in source  # the campaign's own source was uploaded, not exported
    _token, secret = token_create(user=team.viewer, name="script")
    body = client_for(team.viewer).get(f"/api/v1/projects/alpha/datasets/{version.dataset.public_id}/",
                                       HTTP_AUTHORIZATION=f"Bearer {secret}").json()
    assert body["versions"][0]["review_campaign"] == {"id": campaign.public_id, "name": "pass 1"}
    body = client_for(team.viewer).get(f"/api/v1/projects/alpha/datasets/{campaign.source_version.dataset.public_id}/",
                                       HTTP_AUTHORIZATION=f"Bearer {secret}").json()
    assert body["versions"][0]["review_campaign"] is None


def test_the_list_shows_each_campaigns_progress_in_as_many_queries_for_any_number(
        campaign, team, carol, client_for, preference_version, django_assert_num_queries):
    """QA: the campaign list had no progress column: seeing how far each campaign was meant opening it.
    Each row says how many items are complete of all, with a bar, counted in the list's own query."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for sequence in (1, 2):
        item = Item.objects.get(campaign=campaign, sequence=sequence)
        answer(item, team.teammate, "a")
        answer(item, carol, "a")
    answer(Item.objects.get(campaign=campaign, sequence=3), team.teammate, "a")  # one review of two: not complete
    client = client_for(team.viewer)
    list_url = reverse("review:list", args=["alpha"])
    with CaptureQueriesContext(connection) as one_campaign:
        page = client.get(list_url).content.decode()
    row = page.split(url("detail", campaign))[1].split("</tr>")[0]
    assert ('<td class="campaign-progress"><div class="review-progress"><div class="bar" role="progressbar" aria-valuemin="0" '
            'aria-valuemax="100" aria-valuenow="50"><span style="width: 50%"></span></div>'
            '<span class="percent">2 / 4 complete</span></div></td>') in row
    for index in range(3):
        create_loaded(project=team.project, name=f"pass {index + 2}", guidelines="", required_reviews=1,
                      reviewers=[carol], source_version=preference_version, user=team.owner)
    with django_assert_num_queries(len(one_campaign)):
        page = client.get(list_url).content.decode()
    assert page.count("0 / 4 complete") == 3 and page.count('aria-valuenow="0"') == 3


def test_the_list_counts_each_campaigns_items_without_reading_them(campaign, team, carol, client_for):
    """The list's query joined every item of the project's campaigns to count them (distinct), on each load of the
    campaign list, the arena and the leaderboard: 3,000 items took 40-150 ms (bench/pages_at_scale.py). Each count is
    a subquery on the items' index: no query of the page joins the items, and 40 items take as many queries as 4."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = client_for(team.owner)
    counts = []
    for complete, total in ((1, 4), (2, 40)):
        services.items_add(campaign=campaign, pairs=[
            services.Pair(prompt=f"Question {index}", response_a="yes", response_b="no", source="dataset")
            for index in range(total - campaign.items.count())])
        item = Item.objects.filter(campaign=campaign, status=ItemStatus.PENDING).first()
        answer(item, team.teammate, "a")
        answer(item, carol, "a")
        for name, address in (("review:list", reverse("review:list", args=["alpha"])),
                              ("chat:arena", reverse("chat:arena", args=["alpha"])),
                              ("chat:leaderboard", reverse("chat:leaderboard", args=["alpha"]))):
            with CaptureQueriesContext(connection) as queries:
                page = client.get(address).content.decode()
            assert not [query["sql"] for query in queries if 'JOIN "review_item"' in query["sql"]], name
            if name == "review:list":
                assert f"{complete} / {total} complete" in page
                counts.append(len(queries))
    assert counts[0] == counts[1]


def test_the_list_flags_campaigns_with_too_few_reviewers(campaign, team, carol, client_for, preference_version):
    """QA: the campaign page said 'Too few reviewers' (no item can be complete), but the campaign list did not,
    so a stalled campaign looked like any other there. Its row is flagged by the campaign page's own rule:
    reviewers who may still review (not those made viewers) fewer than the reviews per item."""
    from tests.webapp.factories import make_user
    from webapp.projects import services as project_services
    from webapp.projects.models import Membership, Role

    dave = make_user("dave")
    project_services.membership_add(project=team.project, user=dave, role=Role.MEMBER)
    three = create_loaded(project=team.project, name="three each", guidelines="", required_reviews=3,
                          reviewers=[team.teammate, carol], source_version=preference_version, user=team.owner)
    with_a_viewer = create_loaded(project=team.project, name="with dave", guidelines="", required_reviews=2,
                                  reviewers=[carol, dave], source_version=preference_version, user=team.owner)
    project_services.membership_set_role(membership=Membership.objects.get(project=team.project, user=dave),
                                         role=Role.VIEWER)
    client = client_for(team.viewer)
    page = client.get(reverse("review:list", args=["alpha"])).content.decode()
    rows = {each: page.split(url("detail", each))[1].split("</tr>")[0] for each in (campaign, three, with_a_viewer)}
    assert "too few reviewers" not in rows[campaign]
    assert '<span class="badge badge-error too-few-reviewers">too few reviewers (2 of 3 needed)</span>' in rows[three]
    assert '<span class="badge badge-error too-few-reviewers">too few reviewers (1 of 2 needed)</span>' in rows[
        with_a_viewer]
    for each, row in rows.items():
        flagged_on_its_page = "Too few reviewers" in client.get(url("detail", each)).content.decode()
        assert flagged_on_its_page == ("too-few-reviewers" in row), each.name


def test_the_owner_changes_the_settings(campaign, team, carol, client_for):
    owner = client_for(team.owner)
    assert owner.get(url("settings", campaign)).status_code == 200
    response = owner.post(url("settings", campaign), {"guidelines": "New *rules*.", "required_reviews": 1,
                                                      "reviewers": [carol.pk]})
    assert response.status_code == 302
    campaign.refresh_from_db()
    assert (campaign.guidelines, campaign.required_reviews) == ("New *rules*.", 1)
    assert list(campaign.reviewers.values_list("username", flat=True)) == ["carol"]
    response = owner.post(url("settings", campaign), {"guidelines": "", "required_reviews": 11,
                                                      "reviewers": [carol.pk]})
    assert response.status_code == 400 and b"less than or equal to 10" in response.content


def test_more_reviews_per_item_send_a_conflict_back_only_to_reviewers_blind_to_it(campaign, team, carol, client_for):
    """Raising reviews per item sends conflicts back to review for another answer, and the queue served them to any
    reviewer who had not answered them: an owner reviewing too, who had read their answers, comments and models on
    the conflicts page, gave the deciding review as if blind. A conflict goes back only to reviewers who have neither
    answered it nor read it there, and the owner is told how many went back and how many no reviewer can take."""
    from tests.webapp.factories import make_user
    from webapp.projects import services as project_services
    from webapp.projects.models import Role
    from webapp.review import selectors

    conflicts = [Item.objects.get(campaign=campaign, sequence=sequence) for sequence in (2, 3)]
    for item in conflicts:
        answer(item, team.teammate, "a")
        answer(item, carol, "b")
    owner = client_for(team.owner)
    page = owner.get(url("conflicts", campaign)).content.decode()
    assert page.count('class="card conflict"') == 2 and 'id="conflicts-read-note"' in page

    response = owner.post(url("settings", campaign), {"guidelines": "", "required_reviews": 3,
                                                      "reviewers": [team.teammate.pk, carol.pk, team.owner.pk]},
                          follow=True)
    said = response.content.decode()
    assert "2 conflicts went back to review for a review more (3 per item now): each goes only to reviewers who " \
           "have neither answered it nor read its answers on the conflicts page." in said
    assert "2 of them cannot get the reviews they lack from this campaign&#x27;s reviewers" in said
    assert [item.status for item in Item.objects.filter(pk__in=[item.pk for item in conflicts])] == [
        ItemStatus.IN_REVIEW] * 2
    campaign.refresh_from_db()
    assert selectors.items_out_of_reach(campaign=campaign, reviewer_count=3) == 2
    served = []
    while (item := services.queue_next_item(campaign=campaign, user=team.owner)) is not None:
        served.append(item.sequence)
        answer(item, team.owner, "a")
    assert served == [1, 4]

    dave = make_user("dave")
    project_services.membership_add(project=team.project, user=dave, role=Role.MEMBER)
    response = owner.post(url("settings", campaign), {"guidelines": "", "required_reviews": 3, "reviewers": [
        team.teammate.pk, carol.pk, team.owner.pk, dave.pk]}, follow=True)
    assert "went back to review" not in response.content.decode()  # reviews per item unchanged: nothing went back
    assert selectors.items_out_of_reach(campaign=campaign, reviewer_count=4) == 0
    assert services.queue_next_item(campaign=campaign, user=dave).sequence == 1
    answer(Item.objects.get(campaign=campaign, sequence=1), dave, "a")
    assert services.queue_next_item(campaign=campaign, user=dave).sequence == 2


def test_the_items_page_filters_by_status(campaign, team, carol, client_for):
    item = Item.objects.get(campaign=campaign, sequence=2)
    answer(item, team.teammate, "a")
    page = client_for(team.viewer).get(url("items", campaign), {"status": "in_review"})
    assert [row.item for row in page.context["rows"]] == [item]
    assert b"Capital of France?" in page.content and b"What is 2+2?" not in page.content


def test_the_items_page_names_each_items_source_once(campaign, team, client_for):
    """The Source column read 'Dataset row row 2': the source's label and then its row."""
    Item.objects.filter(campaign=campaign, sequence=1).update(source="runs", source_row=7)
    page = client_for(team.viewer).get(url("items", campaign)).content.decode()
    assert "<td>Dataset row 2</td>" in page and "row row" not in page
    assert "<td>Run generations, prompt row 7</td>" in page


def test_counts_of_one_read_in_the_singular(campaign, team, carol, client_for):
    """The campaign page read 'You answered 1 items'."""
    item = Item.objects.get(campaign=campaign, sequence=1)
    answer(item, team.teammate, "a")
    page = client_for(team.teammate).get(url("detail", campaign)).content.decode()
    assert "<dt>You answered</dt><dd>1 item</dd>" in page
    answer(Item.objects.get(campaign=campaign, sequence=2), team.teammate, "b")
    page = client_for(team.teammate).get(url("detail", campaign)).content.decode()
    assert "<dt>You answered</dt><dd>2 items</dd>" in page and "all 4 items" in page and "of <b>4</b> items" in page
    Item.objects.filter(campaign=campaign, sequence__gt=1).delete()
    services.campaign_update(campaign=campaign, guidelines="", required_reviews=1, reviewers=[])
    page = client_for(team.owner).get(url("detail", campaign)).content.decode()
    assert "the 1 item</a>" in page and "of <b>1</b> item</li>" in page
    assert "Each item needs 1 review from different reviewers, but the campaign has 0 reviewers" in page


def test_a_done_export_links_a_dpo_run_on_its_version(campaign, team, carol, client_for):
    """QA (second first-use pass): the campaign's Exports table named the new preference version and led no further;
    DPO on it, the reason for the export, was started from the Runs page. A done export's row links the launch form
    with the version chosen, for those who launch runs."""
    from webapp.datasets.services import dataset_version_validate
    from webapp.review.models import Export

    version = exported_once_two_agree(campaign, team, carol)
    launch = f'href="/p/alpha/runs/new/?task=dpo&amp;data={version.public_id}"'
    assert launch not in client_for(team.owner).get(url("detail", campaign)).content.decode()  # still validating
    dataset_version_validate(version_id=version.pk)
    services.export_settle(version_id=version.pk)
    assert Export.objects.get(version=version).status == "done"
    assert launch in client_for(team.teammate).get(url("detail", campaign)).content.decode()
    assert launch not in client_for(team.viewer).get(url("detail", campaign)).content.decode()


def test_the_items_page_shows_the_label_each_complete_item_is_exported_with(campaign, team, carol, client_for):
    """The Final column showed only an owner's resolution: an item complete by its reviewers' majority
    showed nothing there, though the export writes it with that label."""
    by_majority, resolved, in_review = (Item.objects.get(campaign=campaign, sequence=number) for number in (1, 2, 3))
    answer(by_majority, team.teammate, "b")
    answer(by_majority, carol, "b")
    answer(resolved, team.teammate, "a")
    answer(resolved, carol, "b")
    services.conflict_resolve(item=resolved, label="tie", user=team.owner)
    answer(in_review, team.teammate, "a")
    rows = {row.item.sequence: row for row in client_for(team.viewer).get(url("items", campaign)).context["rows"]}
    assert (rows[1].final_label, rows[1].resolved) == ("B better", False)
    assert (rows[2].final_label, rows[2].resolved) == ("Tie", True)
    assert rows[3].final_label == "" and rows[4].final_label == ""
    page = client_for(team.viewer).get(url("items", campaign)).content.decode()
    assert 'B better <span class="muted">(majority)</span>' in page and 'Tie <span class="muted">(owner)</span>' in page


def test_the_campaign_page_says_when_too_few_reviewers_could_ever_complete_an_item(campaign, team, carol,
                                                                                    client_for):
    """Two reviews per item from one reviewer can never be given: items stay 'in review' for ever
    unless the page says why and what to change."""
    assert "Too few reviewers" not in client_for(team.owner).get(url("detail", campaign)).content.decode()
    services.campaign_update(campaign=campaign, guidelines="", required_reviews=3, reviewers=[team.teammate, carol])
    page = client_for(team.owner).get(url("detail", campaign)).content.decode()
    assert "Too few reviewers" in page
    assert "Each item needs 3 reviews from different reviewers, but the campaign has 2 reviewers" in page
    assert f'in <a href="{url("settings", campaign)}">Settings</a>' in page
    member_page = client_for(team.teammate).get(url("detail", campaign)).content.decode()
    assert "has 2 reviewers: no item can be complete until an owner adds reviewers" in member_page


def test_a_refused_export_keeps_what_was_typed_and_says_why_beside_the_field(campaign, team, client_for):
    """A refused export redirected to the campaign page, which showed the default dataset name and every
    option ticked again, and a name over 100 characters read 'Name the dataset to export to.'"""
    make_ready_version(team.project, name="plain <b>sft</b>", kind="sft")
    owner = client_for(team.owner)
    response = owner.post(url("export", campaign), {"dataset_name": "plain <b>sft</b>", "drop_both_bad": "on"})
    page = response.content.decode()
    assert response.status_code == 400
    assert 'value="plain &lt;b&gt;sft&lt;/b&gt;"' in page
    assert ('<small class="error" id="id_dataset_name_error">&#x27;plain &lt;b&gt;sft&lt;/b&gt;&#x27; is an sft dataset; '
            'choose a preference dataset or a new name</small>') in page
    assert re.search(r'aria-describedby="[^"]*\bid_dataset_name_error"', page), "the field names its error"
    assert 'name="drop_ties" id="id_drop_ties"' in page and 'name="drop_ties" id="id_drop_ties" checked' not in page
    assert 'name="drop_both_bad" id="id_drop_both_bad" checked' in page
    assert 'http-equiv="refresh"' not in page  # this address takes only a POST

    response = owner.post(url("export", campaign), {"dataset_name": "x" * 150})
    page = response.content.decode()
    assert response.status_code == 400 and "at most 100 characters (it has 150)" in page
    assert "Name the dataset to export to" not in page
    assert not campaign.exports.exists()


def test_the_exports_table_says_an_export_failed_and_why(campaign, team, carol, client_for):
    """QA: an export whose version failed validation read 'gen-reviewed v1 · 5 pairs' with a link, as if
    written; README says the table says why an export failed."""
    item = Item.objects.get(campaign=campaign, sequence=1)
    answer(item, team.teammate, "a")
    answer(item, carol, "a")
    export = services.export_create(campaign=campaign, options=services.ExportOptions(dataset_name="gen-reviewed"),
                                    user=team.owner)
    export = services.export_write(export_id=export.pk)
    owner = client_for(team.owner)
    page = owner.get(url("detail", campaign)).content.decode()
    row = page.split('<table class="table exports">')[1].split("</tr>")[1]
    assert "validating" in row and 'http-equiv="refresh"' in page
    export.version.absolute_path.write_text('{"prompt": "2+2?", "chosen": "", "rejected": "5"}\n')
    validate_dataset_version.apply(args=[export.version.pk]).get()
    page = owner.get(url("detail", campaign)).content.decode()
    row = page.split('<table class="table exports">')[1].split("</tr>")[1]
    assert '<span class="badge status-conflict">failed</span>' in row
    assert "gen-reviewed v1 failed validation: line 1, row 1, field &#x27;chosen&#x27;: is an empty string" in row
    assert '<td class="num">—</td>' in row, "no pair was written"
    assert 'http-equiv="refresh"' not in page


def test_the_exports_table_names_the_time_zone_of_its_times(campaign, team, carol, client_for):
    """QA: the Exports table showed "2026-12-05 14:05", where the detail pages say "UTC" after a time; every
    page shows a moment through the ``when`` filter, naming the zone."""
    item = Item.objects.get(campaign=campaign, sequence=1)
    answer(item, team.teammate, "a")
    answer(item, carol, "a")
    export = services.export_create(campaign=campaign, options=services.ExportOptions(dataset_name="gen-reviewed"),
                                    user=team.owner)
    Export.objects.filter(pk=export.pk).update(created_at=datetime(2026, 12, 5, 14, 5, 59, tzinfo=timezone.utc))
    page = client_for(team.viewer).get(url("detail", campaign)).content.decode()
    row = page.split('<table class="table exports">')[1].split("</tr>")[1]
    assert "<td>2026-12-05 14:05 UTC</td>" in row


def test_a_campaign_whose_source_dataset_was_deleted_says_so(campaign, team, client_for, preference_version):
    """QA: once its source dataset was deleted, the campaign read 'arena votes' on the list and on its page."""
    preference_version.dataset.delete()
    for page_url in (url("detail", campaign), reverse("review:list", args=[team.project.slug])):
        page = client_for(team.viewer).get(page_url).content.decode()
        assert '<bdi>prefs v1</bdi> <span class="muted">(deleted)</span>' in page, page_url
        assert "arena votes" not in page, page_url


def test_a_resolution_made_meanwhile_asks_before_it_is_changed(campaign, team, carol, client_for):
    """QA: the second of two owners resolving a conflict was told 'Item 2 resolved: b.' and silently replaced
    the first owner's label; messages showed internal codes ('resolved: a.')."""
    item, alice = in_conflict_with_a_second_owner(campaign, team, carol, username="alice")
    owner = client_for(team.owner)
    conflicts = owner.get(url("conflicts", campaign)).content.decode()
    assert '<input type="hidden" name="shown_label" value="">' in conflicts
    page = client_for(alice).post(url("resolve", campaign, item.public_id), {"label": "a", "shown_label": ""},
                                  follow=True).content.decode()
    assert "Item 2 resolved: A better." in page and "resolved: a." not in page

    response = owner.post(url("resolve", campaign, item.public_id), {"label": "b", "shown_label": ""}, follow=True)
    page = response.content.decode()
    assert response.status_code == 409
    assert "Item 2 is already resolved as A better by <bdi>alice</bdi>" in page
    assert '<input type="hidden" name="shown_label" value="a">' in page
    assert '<button type="submit" name="label" value="b" class="primary">Change to B better</button>' in page
    item.refresh_from_db()
    assert (item.resolved_label, item.resolved_by) == ("a", alice)

    page = owner.post(url("resolve", campaign, item.public_id), {"label": "b", "shown_label": "a"},
                      follow=True).content.decode()
    assert "Item 2 resolved: B better." in page
    item.refresh_from_db()
    assert (item.resolved_label, item.resolved_by) == ("b", team.owner)
    page = client_for(alice).post(url("resolve", campaign, item.public_id), {"label": "b"}, follow=True).content.decode()
    assert f"Item 2 is already resolved as B better by {isolated('alpha-owner')}; nothing changed." in page


def test_the_page_asking_to_change_a_resolution_is_safe_to_reload(campaign, team, carol, client_for):
    """QA: a label pressed over a resolution made meanwhile was answered by the page asking to confirm the
    change itself (409 to the POST), so reloading that page made the browser offer to send the form again.
    The press now redirects to the page, a GET of the resolve address with the label pressed; reloading it
    asks again and changes nothing, and once nothing is left to confirm it goes back to the conflicts."""
    item, alice = in_conflict_with_a_second_owner(campaign, team, carol, username="alice")
    services.conflict_resolve(item=item, label="a", user=alice, shown_label="")
    owner = client_for(team.owner)
    response = owner.post(url("resolve", campaign, item.public_id), {"label": "b", "shown_label": ""})
    confirm_url = f'{url("resolve", campaign, item.public_id)}?label=b'
    assert (response.status_code, response.url) == (302, confirm_url)
    for _reload in range(2):
        page = owner.get(confirm_url)
        assert page.status_code == 409
        assert "Item 2 is already resolved as A better by <bdi>alice</bdi>" in page.content.decode()
        assert '<input type="hidden" name="shown_label" value="a">' in page.content.decode()
        item.refresh_from_db()
        assert (item.resolved_label, item.resolved_by) == ("a", alice)

    owner.post(url("resolve", campaign, item.public_id), {"label": "b", "shown_label": "a"})
    page = owner.get(confirm_url, follow=True)
    assert page.redirect_chain == [(url("conflicts", campaign), 302)]
    assert f"Item 2 is already resolved as B better by {isolated('alpha-owner')}; nothing changed." in page.content.decode()
    page = owner.get(f'{url("resolve", campaign, item.public_id)}?label=skip', follow=True)
    assert page.redirect_chain == [(url("conflicts", campaign), 302)]
    assert "Choose the final label: A better, B better, tie or both bad." in page.content.decode()


def test_an_empty_queue_says_when_items_held_by_others_come_back(campaign, team, carol, client_for):
    """QA: 'Nothing left for you to review' while an item was still pending, leased to another reviewer."""
    services.campaign_update(campaign=campaign, guidelines="", required_reviews=1, reviewers=[team.teammate, carol])
    for sequence in (1, 2, 3):
        answer(Item.objects.get(campaign=campaign, sequence=sequence), team.teammate, "a")
    assert services.queue_next_item(campaign=campaign, user=carol).sequence == 4
    page = client_for(team.teammate).get(url("next", campaign)).content.decode()
    assert "Nothing left for you to review" not in page
    assert ("Nothing for you to review right now: 1 item is held by another reviewer. An item not answered while "
            "it is held comes back to the queue; the first in 9\xa0minutes") in page
    # QA: the clock time had no zone, read by a reviewer elsewhere as their own.
    until = Lease.objects.get(campaign=campaign, reviewer=carol).until
    assert f"(at {until:%H:%M} UTC)" in page
    expire_leases(Item.objects.get(campaign=campaign, sequence=4))
    assert client_for(team.teammate).get(url("next", campaign)).context["item"].sequence == 4
    answer(Item.objects.get(campaign=campaign, sequence=4), team.teammate, "a")
    page = client_for(team.teammate).get(url("next", campaign)).content.decode()
    assert "Nothing left for you to review" in page
    # QA (second first-use pass): the page ended there, the campaign's title its only way on.
    assert (f'See <a href="{url("detail", campaign)}">its progress</a>, or '
            '<a href="/p/alpha/review/">the project\'s other campaigns</a>.') in page


def test_removing_a_reviewer_from_the_project_warns_that_items_cannot_complete(campaign, team, carol, client_for):
    """QA: removing a reviewer from the project left the campaign one reviewer short of its reviews per item,
    so no item could complete, and its Settings page said nothing of it."""
    from webapp.projects import services as project_services
    from webapp.projects.models import Membership

    project_services.membership_remove(membership=Membership.objects.get(project=team.project, user=carol))
    owner = client_for(team.owner)
    page = owner.get(url("detail", campaign)).content.decode()
    assert "Each item needs 2 reviews from different reviewers, but the campaign has 1 reviewer" in page
    settings = owner.get(url("settings", campaign)).content.decode()
    assert "Too few reviewers" in settings
    assert "Each item needs 2 reviews from different reviewers, but the campaign has 1 reviewer" in settings
    services.campaign_update(campaign=campaign, guidelines="", required_reviews=1, reviewers=[team.teammate])
    assert "Too few reviewers" not in owner.get(url("settings", campaign)).content.decode()


def test_it_rejects_guidelines_past_the_cap(campaign, team, carol, client_for, preference_version):
    """Guidelines of any length were stored and rendered beside every item a reviewer opens."""
    owner = client_for(team.owner)
    assert 'maxlength="20000"' in owner.get(url("settings", campaign)).content.decode()
    response = owner.post(url("settings", campaign), {"guidelines": "x" * 20_001, "required_reviews": 1,
                                                      "reviewers": [carol.pk]})
    assert response.status_code == 400 and b"20,001 characters; at most 20,000" in response.content
    campaign.refresh_from_db()
    assert campaign.guidelines == "Prefer **correct** answers."
    with pytest.raises(ValidationError) as refused:
        services.campaign_create(project=team.project, name="long", guidelines="x" * 20_001, required_reviews=1,
                                 reviewers=[carol], source_version=preference_version, user=team.owner)
    assert "guidelines" in refused.value.message_dict


def test_the_campaign_page_says_which_items_skips_left_out_of_reach(campaign, team, carol, client_for):
    """QA: with as many reviewers as each item needs, an item one of them skipped could never be complete (a
    skip is never served again), yet the campaign page counted it as waiting for reviews, and every reviewer
    was told "Nothing left for you to review": the campaign could not finish and nothing said why. The page
    now counts such items and says what would let them complete."""
    from tests.webapp.factories import make_user
    from webapp.projects import services as project_services
    from webapp.projects.models import Role

    first, second = (Item.objects.get(campaign=campaign, sequence=number) for number in (1, 2))
    answer(first, carol, "skip")
    answer(first, team.teammate, "a")
    answer(second, carol, "a")  # a skip that still leaves room for the reviews needed
    page = client_for(team.owner).get(url("detail", campaign)).content.decode()
    assert ("1 item can no longer be complete: it needs 2 reviews from different reviewers, and after the skips "
            "too few reviewers are left to give them. Add reviewers or lower the reviews per item in "
            f'<a href="{url("settings", campaign)}">Settings</a>.') in page
    assert "an owner adds reviewers or lowers the reviews per item" in client_for(team.teammate).get(
        url("detail", campaign)).content.decode()
    assert "after the skips too few reviewers are left" in client_for(team.owner).get(
        url("settings", campaign)).content.decode()

    dave = make_user("dave")
    project_services.membership_add(project=team.project, user=dave, role=Role.MEMBER)
    services.campaign_update(campaign=campaign, guidelines="", required_reviews=2, reviewers=[team.teammate, carol, dave])
    assert "can no longer be complete" not in client_for(team.owner).get(url("detail", campaign)).content.decode()
    assert services.queue_next_item(campaign=campaign, user=dave).sequence == 1


def test_a_reviewer_whose_account_is_deactivated_no_longer_counts_as_one(campaign, team, carol, client_for):
    """QA: an administrator deactivated the account of a reviewer who had left the team; they could no
    longer log in, yet they still counted among the campaign's reviewers (so no page said that too few were
    left to complete an item) and were still offered in Settings. A deactivated account reviews nothing."""
    carol.is_active = False
    carol.save(update_fields=["is_active"])
    owner = client_for(team.owner)
    page = owner.get(url("detail", campaign)).content.decode()
    assert "<dt>Reviewers</dt><dd><bdi>alpha-teammate</bdi></dd>" in page
    assert "Each item needs 2 reviews from different reviewers, but the campaign has 1 reviewer" in page
    settings = owner.get(url("settings", campaign)).content.decode()
    assert "carol" not in settings.split('id="id_reviewers"')[1].split("</div>\n</div>")[0]
    assert "carol" not in owner.get(reverse("review:create", args=[team.project.slug])).content.decode()
    with pytest.raises(ValidationError, match="carol cannot review: their account is deactivated"):
        services.campaign_update(campaign=campaign, guidelines="", required_reviews=1,
                                 reviewers=[team.teammate, carol])


def test_the_reviewing_page_offers_to_change_the_last_answer(campaign, team, client_for):
    """After an answer the next page says what it was and offers the other answers (a key pressed by mistake
    could not be taken back); the change lands on the item and the page says so."""
    client = client_for(team.teammate)
    page = client.get(url("next", campaign)).content.decode()
    assert "Your last answer" not in page
    item_id = page.split('name="item" value="')[1].split('"')[0]
    client.post(url("next", campaign), {"item": item_id, "choice": "tie"})
    page = client.get(url("next", campaign)).content.decode()
    last = page.split('class="card last-answer"')[1].split("</section>")[0]
    assert f'<input type="hidden" name="item" value="{item_id}">' in last and "<b>Tie</b>" in last
    assert '<button type="submit" name="choice" value="tie">' not in last
    assert '<button type="submit" name="choice" value="both_bad">Both bad</button>' in last
    response = client.post(url("change", campaign), {"item": item_id, "choice": "both_bad"})
    assert response.status_code == 302 and response["Location"] == url("next", campaign)
    item = Item.objects.get(public_id=item_id)
    assert Review.objects.get(item=item, reviewer=team.teammate).label == "both_bad"
    assert f"Item {item.sequence} changed to both bad." in client.get(url("next", campaign)).content.decode()
    assert client_for(team.viewer).post(url("change", campaign), {"item": item_id, "choice": "tie"}).status_code == 403
    assert client_for(team.outsider).post(url("change", campaign), {"item": item_id, "choice": "tie"}).status_code == 404


def test_a_reviewer_whose_campaign_was_deleted_meanwhile_is_told_so(campaign, team, client_for):
    """QA: an owner deleted a campaign while a reviewer had an item open; the reviewer's answer (or a
    reload, or a change of their last answer) met "Not found … it belongs to a project you are not a
    member of", though they still were one. They now land on the project's campaigns, told that the
    campaign is gone and that the answer was not recorded; outsiders still get 404."""
    reviewer = client_for(team.teammate)
    item = reviewer.get(url("next", campaign)).context["item"]
    reviewer.post(url("next", campaign), {"item": item.public_id, "choice": "tie"})
    open_item = reviewer.get(url("next", campaign)).context["item"]
    services.campaign_delete(campaign=campaign)
    listed = reverse("review:list", args=[team.project.slug])
    for name, data, said in (
            ("next", {"item": open_item.public_id, "choice": "first"}, "your answer was not recorded"),
            ("change", {"item": item.public_id, "choice": "both_bad"}, "your answer was not recorded")):
        response = reviewer.post(url(name, campaign), data)
        assert response.status_code == 302 and response["Location"] == listed
        page = reviewer.get(listed).content.decode()
        assert f"There is no review campaign {isolated(campaign.public_id)} in this project any more" in page and said in page
    response = reviewer.get(url("next", campaign))
    assert response.status_code == 302 and response["Location"] == listed
    assert "your answer" not in reviewer.get(listed).content.decode()
    assert client_for(team.outsider).post(url("next", campaign), {"item": open_item.public_id,
                                                                 "choice": "first"}).status_code == 404


def test_the_last_answer_to_a_resolved_item_is_offered_no_change(campaign, team, carol, client_for):
    """QA: once an owner resolved the item of a reviewer's last answer, the reviewing page still offered
    "Change it to …" buttons, every one of them refused ("whose label is final"). It now says the item was
    resolved, and by whom, and offers none."""
    client = client_for(team.teammate)
    item = client.get(url("next", campaign)).context["item"]
    client.post(url("next", campaign), {"item": item.public_id, "choice": "first"})
    expire_leases(item)
    answer(item, carol, "b" if services.shown_first_for(item_public_id=item.public_id,
                                                        user_id=team.teammate.pk) == "a" else "a")
    item.refresh_from_db()
    assert item.status == ItemStatus.CONFLICT
    services.conflict_resolve(item=item, label="tie", user=team.owner)
    page = client.get(url("next", campaign)).content.decode()
    last = page.split('class="card last-answer"')[1].split("</section>")[0]
    assert f"Your last answer, item {item.sequence}: <b>First better</b>." in last
    assert "resolved by <bdi>alpha-owner</bdi> as Tie, whose label is final." in last and "<button" not in last


def test_the_campaign_page_counts_skips_beside_the_answers_not_among_them(campaign, team, client_for):
    """QA: a reviewer who answered one item and skipped another read "You answered 1 item (1 skipped)" on the
    campaign page, as if the skip were that one answer; the reviewing page says "you answered 1, skipped 1"."""
    client = client_for(team.teammate)
    for choice in ("first", "skip"):
        item = client.get(url("next", campaign)).context["item"]
        client.post(url("next", campaign), {"item": item.public_id, "choice": choice})
    page = client.get(url("detail", campaign)).content.decode()
    assert "<dt>You answered</dt><dd>1 item; skipped 1</dd>" in page
    assert "you answered 1, skipped 1" in client.get(url("next", campaign)).content.decode()
