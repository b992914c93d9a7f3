"""What reviewers decided, and nothing else, becomes training data: a skip carries no edit into the export, and two
reviewers' different edits of the same response are a conflict that an owner resolves (picking one text or writing
it) before the item is exported."""
import json
from html.parser import HTMLParser

import pytest
from django.core.exceptions import ValidationError
from django.utils.html import escape

from tests.webapp.review.conftest import answer, choice_for
from webapp.review import kept_texts, selectors, services
from webapp.review.models import Item, ItemStatus, Review


def edit_of(item, user, side: str, text: str) -> dict[str, str]:
    """The ``review_submit`` keyword that edits response ``side`` (a/b) of ``item`` as ``user`` sees it."""
    shown_first = services.shown_first_for(item_public_id=item.public_id, user_id=user.pk)
    return {"edited_first" if shown_first == side else "edited_second": text}


def export_now(campaign, user, **options):
    export = services.export_create(campaign=campaign, user=user,
                                    options=services.ExportOptions(dataset_name="out", **options))
    return services.export_write(export_id=export.pk)


def rows_of(export) -> dict[str, dict]:
    """The exported rows by item id."""
    lines = export.version.absolute_path.read_text().splitlines()
    return {row["review"]["item"]: row for row in map(json.loads, lines)}


@pytest.fixture
def items(campaign):
    return {item.sequence: item for item in Item.objects.filter(campaign=campaign)}


@pytest.fixture
def three_reviewers(campaign, team, carol):
    """The owner reviews too: a skip still leaves two answers."""
    services.campaign_update(campaign=campaign, guidelines="", required_reviews=2,
                             reviewers=[team.teammate, carol, team.owner])
    return campaign


def test_a_skip_stores_and_exports_none_of_its_edits(three_reviewers, items, team, carol):
    item = items[1]
    review = answer(item, team.teammate, "skip", **edit_of(item, team.teammate, "a", "four (edited, then skipped)"))
    assert (review.edited_a, review.edited_b) == (None, None)
    answer(item, carol, "a")
    answer(item, team.owner, "a")
    rows = rows_of(export_now(three_reviewers, team.owner))
    assert rows[item.public_id]["chosen"] == "4"


def test_an_answer_changed_to_a_skip_takes_its_edits_out_of_the_export(three_reviewers, items, team, carol):
    item = items[1]
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "a", "four"))
    services.review_change(item=item, user=team.teammate, choice="skip")
    assert Review.objects.get(item=item, reviewer=team.teammate).edited_a == "four", "kept, should it be answered again"
    answer(item, carol, "a")
    answer(item, team.owner, "a")
    assert rows_of(export_now(three_reviewers, team.owner))[item.public_id]["chosen"] == "4"


def test_a_blanking_edit_does_not_stop_a_skip(campaign, items, team):
    item = items[1]
    review = answer(item, team.teammate, "skip", **edit_of(item, team.teammate, "a", "  "))
    assert review.label == "skip" and review.edited_a is None


def test_two_different_edits_of_one_response_are_a_conflict_left_out_of_the_export(campaign, items, team, carol):
    item = items[1]
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "a", "four"))
    answer(item, carol, "a", **edit_of(item, carol, "a", "4 (two plus two)"))
    item.refresh_from_db()
    assert item.status == ItemStatus.CONFLICT
    for reviewer in (team.teammate, carol):
        answer(items[2], reviewer, "a")
    export = export_now(campaign, team.owner)
    assert list(rows_of(export)) == [items[2].public_id]
    assert export.counts["unresolved_conflict"] == 1
    entry, = selectors.conflict_entries(campaign=campaign, limit=10)
    assert entry.item == item
    assert [(choice.text, choice.editors) for choice in entry.edit_choices["a"]] == [
        ("four", ["alpha-teammate"]), ("4 (two plus two)", ["carol"])]
    assert entry.edit_choices.keys() == {"a"}


def test_identical_edits_are_no_conflict_and_are_exported(campaign, items, team, carol):
    item = items[1]
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "b", "five"))
    answer(item, carol, "a", **edit_of(item, carol, "b", "five\n"))
    # An edit of the other response by one reviewer alone is no disagreement either.
    item.refresh_from_db()
    assert item.status == ItemStatus.COMPLETE
    row = rows_of(export_now(campaign, team.owner))[item.public_id]
    assert (row["chosen"], row["rejected"]) == ("4", "five")


def test_an_edit_by_one_reviewer_and_none_by_the_other_is_no_conflict(campaign, items, team, carol):
    item = items[1]
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "a", "four"))
    answer(item, carol, "a")
    item.refresh_from_db()
    assert item.status == ItemStatus.COMPLETE


def test_a_skipped_edit_makes_no_conflict(three_reviewers, items, team, carol):
    item = items[1]
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "a", "four"))
    answer(item, carol, "a", **edit_of(item, carol, "a", "4 (two plus two)"))
    services.review_change(item=item, user=carol, choice="skip")
    item.refresh_from_db()
    assert item.status == ItemStatus.IN_REVIEW  # one answer of two now
    answer(item, team.owner, "a")
    item.refresh_from_db()
    assert item.status == ItemStatus.COMPLETE
    assert rows_of(export_now(three_reviewers, team.owner))[item.public_id]["chosen"] == "four"


def test_the_owner_resolves_an_edit_conflict_by_picking_or_writing_the_text(campaign, items, team, carol):
    item = items[3]  # chats: the edit is of the last turn
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "a", "Hi there!"))
    answer(item, carol, "a", **edit_of(item, carol, "a", "Hello!"))
    with pytest.raises(ValidationError, match="final text of response A") as refused:
        services.conflict_resolve(item=item, label="a", user=team.owner, shown_label="")
    assert list(refused.value.message_dict) == ["text_a"]
    with pytest.raises(ValidationError, match="final text of response A"):
        services.conflict_resolve(item=item, label="a", user=team.owner, shown_label="", texts={"a": " \n"})
    item = services.conflict_resolve(item=item, label="a", user=team.owner, shown_label="", texts={"a": "Hello!"})
    assert (item.status, item.resolved_label, item.resolved_a, item.resolved_b) == (
        ItemStatus.COMPLETE, "a", "Hello!", None)
    row = rows_of(export_now(campaign, team.owner, drop_ties=False))[item.public_id]
    assert row["chosen"] == [{"role": "assistant", "content": "Hello!"}]
    assert row["review"]["resolved"] is True


def test_a_written_text_and_a_label_conflict_resolve_together(campaign, items, team, carol):
    item = items[4]
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "b", "k-a-t?"))
    answer(item, carol, "b", **edit_of(item, carol, "b", "c-a-t!"))
    item.refresh_from_db()
    assert item.status == ItemStatus.CONFLICT
    services.conflict_resolve(item=item, label="b", user=team.owner, shown_label="",
                              texts={"b": "C-A-T\r\nwritten by the owner", "a": "ignored: no conflict on A"})
    item.refresh_from_db()
    assert (item.resolved_a, item.resolved_b) == (None, "C-A-T\nwritten by the owner")
    row = rows_of(export_now(campaign, team.owner))[item.public_id]
    assert (row["chosen"], row["rejected"]) == ("C-A-T\nwritten by the owner", "c-a-t")


def test_an_answer_changed_back_from_a_skip_brings_its_edit_conflict_back(three_reviewers, items, team, carol):
    item = items[1]
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "a", "four"))
    answer(item, carol, "skip")
    answer(item, team.owner, "a", **edit_of(item, team.owner, "a", "IV"))
    item.refresh_from_db()
    assert item.status == ItemStatus.CONFLICT
    services.review_change(item=item, user=team.owner, choice="skip")
    services.review_change(item=item, user=carol, choice=choice_for(item, carol, "a"))
    item.refresh_from_db()
    assert item.status == ItemStatus.COMPLETE


def test_more_reviews_per_item_keep_an_edit_conflict_a_conflict_once_complete(campaign, items, team, carol):
    item = items[1]
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "a", "four"))
    answer(item, carol, "a", **edit_of(item, carol, "a", "IV"))
    services.campaign_update(campaign=campaign, guidelines="", required_reviews=3,
                             reviewers=[team.teammate, carol, team.owner])
    item.refresh_from_db()
    assert item.status == ItemStatus.IN_REVIEW
    services.campaign_update(campaign=campaign, guidelines="", required_reviews=2,
                             reviewers=[team.teammate, carol, team.owner])
    item.refresh_from_db()
    assert item.status == ItemStatus.CONFLICT


def test_the_conflicts_page_shows_both_edits_escaped_with_who_made_them_and_resolves_with_a_pick(
        campaign, items, team, carol, client_for):
    from django.urls import reverse

    def url(name, *extra):
        return reverse(f"review:{name}", args=[campaign.project.slug, campaign.public_id, *extra])

    item = items[2]
    hostile = '<script>window.pwned=1</script>"'
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "a", hostile))
    answer(item, carol, "a", **edit_of(item, carol, "a", "Paris, France"))
    owner = client_for(team.owner)
    page = owner.get(url("conflicts")).content.decode()
    assert "<script>window.pwned" not in page
    assert page.count("&lt;script&gt;window.pwned=1&lt;/script&gt;&quot;") == 3  # the table, the pick's value and text
    assert "edited by <bdi>alpha-teammate</bdi>" in page and "edited by <bdi>carol</bdi>" in page
    assert "Reviewers edited response A differently" in page and "response B differently" not in page
    refused = owner.post(url("resolve", item.public_id), {"label": "a", "shown_label": ""}, follow=True)
    assert "choose the final text of response A" in refused.content.decode()
    item.refresh_from_db()
    assert item.status == ItemStatus.CONFLICT
    # Picked from the page as sent: the attribute's text comes back as it was edited.
    owner.post(url("resolve", item.public_id), {"label": "a", "shown_label": "", "pick_a": hostile, "text_a": ""})
    item.refresh_from_db()
    assert (item.status, item.resolved_a) == (ItemStatus.COMPLETE, hostile)
    # Nothing picked: the text written is the final one.
    other = items[1]
    answer(other, team.teammate, "b", **edit_of(other, team.teammate, "b", "five"))
    answer(other, carol, "b", **edit_of(other, carol, "b", "V"))
    owner.post(url("resolve", other.public_id), {"label": "b", "shown_label": "", "pick_a": "", "pick_b": "",
                                                 "text_b": "5 (written)"})
    other.refresh_from_db()
    assert (other.status, other.resolved_b) == (ItemStatus.COMPLETE, "5 (written)")


def test_changing_an_edited_answer_to_a_skip_says_its_edits_are_unused(campaign, items, team, client_for):
    from django.urls import reverse

    item = items[1]
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "a", "four"))
    page = client_for(team.teammate).post(
        reverse("review:change", args=[campaign.project.slug, campaign.public_id]),
        {"item": item.public_id, "choice": "skip"}, follow=True).content.decode()
    assert "Item 1 changed to skip; your edits are not used while it is skipped." in page


def second_owner(team):
    from tests.webapp.factories import make_user
    from webapp.projects import services as project_services
    from webapp.projects.models import Role

    alice = make_user("alice")
    project_services.membership_add(project=team.project, user=alice, role=Role.OWNER)
    return alice


def test_a_resolution_made_meanwhile_keeps_the_second_owners_text_for_them_to_decide(campaign, items, team, carol,
                                                                                   client_for):
    """Two owners resolving one conflict at once: the second's text (picked or written) was dropped, with only a
    notice ('already resolved ... nothing changed' for the same label; for another, a page whose change kept the first
    owner's texts). The second is asked, on a page showing the first's label and texts beside a form holding exactly
    the text they chose; confirming resolves with it, and reloading the page sends nothing."""
    from django.urls import reverse

    alice = second_owner(team)
    item = items[1]
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "a", "four"))
    answer(item, carol, "b", **edit_of(item, carol, "a", "IV"))
    services.conflict_resolve(item=item, label="a", user=alice, shown_label="", texts={"a": "IV"})
    resolve = reverse("review:resolve", args=[campaign.project.slug, campaign.public_id, item.public_id])
    owner = client_for(team.owner)
    written = "4 <b>as I wrote it</b>\n  "
    for label, sent in (("a", {"pick_a": "", "text_a": written}), ("b", {"pick_a": "four", "text_a": ""})):
        mine = written if sent["text_a"] else "four"
        response = owner.post(resolve, {"label": label, "shown_label": "", **sent})
        assert (response.status_code, response.url) == (302, f"{resolve}?label={label}")
        for _reload in range(2):
            page = owner.get(response.url)
            text = page.content.decode()
            assert page.status_code == 409
            assert "Item 1 is already resolved as A better by <bdi>alice</bdi>" in text
            assert '<div class="text their-text" data-side="a">IV</div>' in text
            assert f'<textarea name="text_a" rows="4" aria-label="Your final text of response A">\n{escape(mine)}</textarea>' \
                in text
            assert "<b>as I wrote" not in text
            item.refresh_from_db()
            assert (item.resolved_label, item.resolved_a, item.resolved_by) == ("a", "IV", alice)
        owner.post(resolve, {"label": label, "shown_label": "a", "text_a": mine})
        item.refresh_from_db()
        assert (item.resolved_label, item.resolved_a, item.resolved_by) == (label, mine, team.owner)
        services.conflict_resolve(item=item, label="a", user=alice, shown_label=label, texts={"a": "IV"})
    # The same label and text as the resolution made meanwhile: nothing to decide, nothing changed.
    page = owner.post(resolve, {"label": "a", "shown_label": "", "pick_a": "IV"}, follow=True)
    assert "Item 1 is already resolved as A better by" in page.content.decode() and page.status_code == 200


def test_a_refused_resolution_shows_the_form_again_with_what_was_typed(campaign, items, team, carol, client_for):
    """A resolution refused for a missing final text went back to the conflicts page with a message: the text the owner
    had written (or picked) for the other response was gone. The page comes back holding every pick and text sent, the
    refusal beside the response it names; nothing is saved."""
    from django.urls import reverse

    item = items[1]
    answer(item, team.teammate, "a", **{**edit_of(item, team.teammate, "a", "four"),
                                       **edit_of(item, team.teammate, "b", "five")})
    answer(item, carol, "a", **{**edit_of(item, carol, "a", "IV"), **edit_of(item, carol, "b", "V")})
    resolve = reverse("review:resolve", args=[campaign.project.slug, campaign.public_id, item.public_id])
    owner = client_for(team.owner)
    written = "4 <i>written</i>\n"
    response = owner.post(resolve, {"label": "a", "shown_label": "", "pick_a": "", "text_a": written, "pick_b": ""})
    page = response.content.decode()
    assert response.status_code == 400
    card = page.split(f'data-item="{item.public_id}"')[1].split("</article>")[0]
    assert f'<textarea name="text_a" rows="4" aria-label="The final text of response A">\n{escape(written)}</textarea>' \
        in card
    assert '<input type="radio" name="pick_a" value="" required checked>' in card
    assert ('<p class="error" id="error-text_b-' in card and "choose the final text of response B" in card)
    assert "choose the final text of response A" not in card and "<i>written" not in page
    response = owner.post(resolve, {"label": "a", "shown_label": "", "pick_a": "IV", "text_a": ""})
    card = response.content.decode().split(f'data-item="{item.public_id}"')[1].split("</article>")[0]
    assert '<input type="radio" name="pick_a" value="IV" required checked>' in card
    item.refresh_from_db()
    assert (item.status, item.resolved_label, item.resolved_a, item.resolved_b) == (ItemStatus.CONFLICT, "", None, None)


def test_an_owners_final_text_is_exported_with_or_without_the_reviewers_edits(campaign, items, team, carol,
                                                                               client_for):
    """Unticking "use reviewers' edited responses" wrote the original response where an owner had written the final
    text of a conflict: the owner's text is a decision, as their label is, not one of the edits the option is about.
    Only reviewers' edits are left out; the page says so beside the box."""
    from django.urls import reverse

    resolved, edited = items[1], items[2]
    answer(resolved, team.teammate, "a", **edit_of(resolved, team.teammate, "a", "four"))
    answer(resolved, carol, "a", **edit_of(resolved, carol, "a", "IV"))
    services.conflict_resolve(item=resolved, label="a", user=team.owner, shown_label="", texts={"a": "4, decided"})
    answer(edited, team.teammate, "a", **edit_of(edited, team.teammate, "a", "Paris, edited"))
    answer(edited, carol, "a")
    rows = rows_of(export_now(campaign, team.owner, apply_edits=False))
    assert rows[resolved.public_id]["chosen"] == "4, decided"
    assert rows[edited.public_id]["chosen"] == "Paris"
    rows = rows_of(export_now(campaign, team.owner, apply_edits=True))
    assert (rows[resolved.public_id]["chosen"], rows[edited.public_id]["chosen"]) == ("4, decided", "Paris, edited")
    page = client_for(team.owner).get(reverse("review:detail", args=[campaign.project.slug, campaign.public_id]))
    assert ("Unticked, the original responses are written, except where an owner resolving a conflict chose or wrote "
            "a response's final text: that text is always written.") in page.content.decode()


class _FormFields(HTMLParser):
    """The fields a browser sends with the page's resolve form (``form.resolve``): its hidden inputs and textareas,
    as they are drawn (a button's ``label`` is the caller's to add)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.fields, self._in_form, self._textarea = {}, False, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form" and "resolve" in (attrs.get("class") or "").split():
            self._in_form = True
        elif self._in_form and tag == "input" and attrs.get("type") == "hidden":
            self.fields[attrs["name"]] = attrs.get("value") or ""
        elif self._in_form and tag == "textarea":
            self._textarea = attrs["name"]
            self.fields[self._textarea] = ""

    def handle_data(self, data):
        if self._textarea:
            self.fields[self._textarea] += data

    def handle_endtag(self, tag):
        if tag == "textarea" and self._textarea:
            # A browser drops the one newline that opens a textarea's content.
            self.fields[self._textarea] = self.fields[self._textarea].removeprefix("\n")
            self._textarea = None
        elif tag == "form":
            self._in_form = False


def form_fields(page) -> dict[str, str]:
    parser = _FormFields()
    parser.feed(page.content.decode())
    return parser.fields


def refused_meanwhile(item, owner, resolve, *, label: str, sent: dict[str, str]):
    """``owner``'s resolution of ``item`` as ``label`` with ``sent`` from a page that showed it unresolved, refused
    for one made meanwhile: the page then asking them to confirm the change."""
    response = owner.post(resolve, {"label": label, "shown_label": "", **sent})
    assert (response.status_code, response.url) == (302, f"{resolve}?label={label}")
    page = owner.get(response.url)
    assert page.status_code == 409
    return page


def resolve_url(item) -> str:
    from django.urls import reverse

    return reverse("review:resolve", args=[item.campaign.project.slug, item.campaign.public_id, item.public_id])


def in_edit_conflict(item, team, carol):
    """``item`` in conflict: the teammate answered A editing response A to "four", carol B editing it to "IV"."""
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "a", "four"))
    answer(item, carol, "b", **edit_of(item, carol, "a", "IV"))


def test_a_final_text_changed_meanwhile_under_the_same_label_is_shown_not_overwritten(campaign, items, team, carol,
                                                                                       client_for):
    """The page asking to change a resolution carried only its label: a third change made meanwhile, a new final text
    under the same label, was overwritten unseen when the owner confirmed theirs. The form carries the resolution it
    showed, texts and all; one changed since asks again, showing the new text beside the owner's."""
    alice = second_owner(team)
    item = items[1]
    in_edit_conflict(item, team, carol)
    services.conflict_resolve(item=item, label="a", user=alice, shown_label="", texts={"a": "IV"})
    owner, resolve = client_for(team.owner), resolve_url(item)
    page = refused_meanwhile(item, owner, resolve, label="b", sent={"pick_a": "four", "text_a": ""})
    # Meanwhile alice, on a page showing her own resolution, gives response A another final text.
    services.conflict_resolve(item=item, label="a", user=alice, shown_label="a", texts={"a": "4 <i>on second thought</i>"})
    response = owner.post(resolve, {**form_fields(page), "label": "b"})
    item.refresh_from_db()
    assert (item.resolved_label, item.resolved_a, item.resolved_by) == ("a", "4 <i>on second thought</i>", alice)
    assert (response.status_code, response.url) == (302, f"{resolve}?label=b")
    page = owner.get(response.url)
    text = page.content.decode()
    assert f'<div class="text their-text" data-side="a">{escape("4 <i>on second thought</i>")}</div>' in text
    assert form_fields(page)["text_a"] == "four"
    owner.post(resolve, {**form_fields(page), "label": "b"})
    item.refresh_from_db()
    assert (item.resolved_label, item.resolved_a, item.resolved_by) == ("b", "four", team.owner)


def test_a_final_text_cleared_on_the_page_asking_to_change_a_resolution_is_refused(campaign, items, team, carol,
                                                                                    client_for):
    """Clearing the box of one's final text on the page asking to change a resolution changed the label and kept the
    other owner's text: the empty box read as no text given. As on the conflicts page, a blank final text is refused:
    the page comes back (400) with the box as sent, the refusal beside it; nothing changes."""
    alice = second_owner(team)
    item = items[1]
    in_edit_conflict(item, team, carol)
    services.conflict_resolve(item=item, label="a", user=alice, shown_label="", texts={"a": "IV"})
    owner, resolve = client_for(team.owner), resolve_url(item)
    page = refused_meanwhile(item, owner, resolve, label="b", sent={"pick_a": "four", "text_a": ""})
    for cleared in ("", " \r\n "):
        response = owner.post(resolve, {**form_fields(page), "text_a": cleared, "label": "b"})
        text = response.content.decode()
        assert response.status_code == 400
        assert "Item 1 is already resolved as A better by <bdi>alice</bdi>" in text
        assert "the final text of response A is blank" in text and 'aria-invalid="true"' in text
        assert form_fields(response)["text_a"] == cleared.replace("\r\n", "\n")
        item.refresh_from_db()
        assert (item.resolved_label, item.resolved_a, item.resolved_by) == ("a", "IV", alice)
    # The conflicts page's form refuses a blank text written in the same words.
    other = items[2]
    in_edit_conflict(other, team, carol)
    response = owner.post(resolve_url(other), {"label": "a", "shown_label": "", "pick_a": "", "text_a": " \n"})
    assert response.status_code == 400 and "the final text of response A is blank" in response.content.decode()


def test_texts_kept_after_a_refusal_go_once_the_item_is_resolved_again_and_show_on_no_other_item(
        campaign, items, team, carol, client_for):
    """The final texts kept for an owner after a refused resolution stayed in their session until they resolved the
    item themselves: once another owner had resolved it again, its page still offered them, against a resolution they
    were never weighed against. They are dropped once the item is resolved again, by anyone, and are kept by item:
    shown on no other."""
    alice = second_owner(team)
    first, second = items[1], items[2]
    for item in (first, second):
        in_edit_conflict(item, team, carol)
        services.conflict_resolve(item=item, label="a", user=alice, shown_label="", texts={"a": "IV"})
    owner = client_for(team.owner)
    page = refused_meanwhile(first, owner, resolve_url(first), label="b", sent={"pick_a": "four", "text_a": ""})
    assert form_fields(page)["text_a"] == "four"
    other = owner.get(f"{resolve_url(second)}?label=b")
    assert other.status_code == 409 and "text_a" not in form_fields(other)
    services.conflict_resolve(item=first, label="a", user=alice, shown_label="a", texts={"a": "4, again"})
    page = owner.get(f"{resolve_url(first)}?label=b")
    assert page.status_code == 409 and "text_a" not in form_fields(page)
    assert kept_texts.SESSION_KEY not in owner.session or first.public_id not in owner.session[kept_texts.SESSION_KEY]


def test_kept_texts_are_bounded_and_go_stale():
    """At most ``MAX_KEPT`` items' texts are kept, the latest; those older than ``MAX_AGE_SECONDS`` or kept against a
    resolution since changed are dropped."""
    store = {}
    for number in range(kept_texts.MAX_KEPT + 3):
        store = kept_texts.with_kept(store, item=f"item-{number}", label="b", texts={"a": f"text {number}"},
                                     resolution="r", now=1000.0 + number)
    assert sorted(store) == sorted(f"item-{number}" for number in range(3, kept_texts.MAX_KEPT + 3))
    assert kept_texts.kept(store, item="item-3", label="b", resolution="r") == {"a": "text 3"}
    assert kept_texts.kept(store, item="item-3", label="a", resolution="r") == {}
    assert kept_texts.kept(store, item="item-3", label="b", resolution="changed") == {}
    now = 1003.0 + kept_texts.MAX_AGE_SECONDS
    fresh = kept_texts.fresh(store, resolutions={f"item-{number}": "r" for number in range(3, 12)}
                             | {"item-12": "changed"}, now=now)
    # item-3 is a day old; item-12's resolution changed since; the rest stand.
    assert sorted(fresh) == sorted(f"item-{number}" for number in range(4, 12))


def test_a_resolution_refused_as_the_item_went_back_to_review_keeps_what_was_typed_and_says_why(
        campaign, items, team, carol, client_for):
    """A conflict that left the conflicts page while its owner was writing its final text (another owner raised the
    reviews per item: back to review) refused the resolution with a redirect and "item 1 is in review, not in
    conflict; only conflicts are resolved": what the owner had written was gone, and nothing said what to do. The page
    comes back (400) with the item's form as sent, saying why it cannot be resolved now and what happens to it, without
    the buttons that would only be refused again."""
    from django.urls import reverse

    item = items[1]
    answer(item, team.teammate, "a", **edit_of(item, team.teammate, "a", "four"))
    answer(item, carol, "b", **edit_of(item, carol, "a", "IV"))
    owner = client_for(team.owner)
    conflicts = reverse("review:conflicts", args=[campaign.project.slug, campaign.public_id])
    assert f'data-item="{item.public_id}"' in owner.get(conflicts).content.decode()
    services.campaign_update(campaign=campaign, guidelines="", required_reviews=3,
                             reviewers=[team.teammate, carol, team.owner])  # another owner, meanwhile
    resolve = reverse("review:resolve", args=[campaign.project.slug, campaign.public_id, item.public_id])
    written = "4 <i>as I wrote it</i>\n"
    response = owner.post(resolve, {"label": "b", "shown_label": "", "pick_a": "", "text_a": written})
    assert response.status_code == 400
    page = response.content.decode()
    assert "Item 1 is not resolved: see why below (what you chose is kept there to copy)." in page
    card = page.split(f'data-item="{item.public_id}"')[1].split("</article>")[0]
    assert ("Item 1 is not in conflict: it is in review, for 3 answers (the campaign&#x27;s reviews per item; an owner "
            "may have raised them since this page was loaded). It comes to the conflicts page if its reviewers "
            "disagree once they have answered.") in card
    assert f'<textarea name="text_a" rows="4" aria-label="The final text of response A">\n{escape(written)}</textarea>' \
        in card
    assert '<input type="radio" name="pick_a" value="" required checked>' in card
    assert "<i>as I wrote" not in page
    assert '<button type="submit" name="label"' not in card
    item.refresh_from_db()
    assert (item.status, item.resolved_label, item.resolved_a) == (ItemStatus.IN_REVIEW, "", None)


def test_a_resolution_refused_as_the_reviewers_agree_now_says_so(campaign, items, team, carol, client_for):
    """A reviewer changed their answer while the owner was deciding: the reviewers agree, the item is complete with
    their label, and the refusal said only "item 2 is complete, not in conflict; only conflicts are resolved"."""
    from django.urls import reverse

    item = items[2]
    answer(item, team.teammate, "a")
    answer(item, carol, "b")
    services.review_change(item=item, user=carol, choice=choice_for(item, carol, "a"))
    resolve = reverse("review:resolve", args=[campaign.project.slug, campaign.public_id, item.public_id])
    response = client_for(team.owner).post(resolve, {"label": "b", "shown_label": ""})
    assert response.status_code == 400
    card = response.content.decode().split(f'data-item="{item.public_id}"')[1].split("</article>")[0]
    assert ("Item 2 is not in conflict: its reviewers agree (one may have changed their answer since this page was "
            "loaded), so it is complete with their label, A better; there is nothing to resolve.") in card
    assert '<button type="submit" name="label"' not in card
    item.refresh_from_db()
    assert (item.status, item.resolved_label) == (ItemStatus.COMPLETE, "")
