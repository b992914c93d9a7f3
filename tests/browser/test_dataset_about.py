"""A member says what a dataset is (About this dataset: source, licence, description) on its page: saved, shown escaped
with the source as a link, a refusal showing the field's error beside what was typed, kept; a viewer reads it and has
no form."""
import pytest

from tests.browser.test_projects import log_in, log_out
from tests.webapp.factories import make_ready_version, make_team
from webapp.datasets.models import Dataset

pytestmark = pytest.mark.browser

DESCRIPTION = "Support chats <b>kept</b> as written.\nOne a line."


def about(page) -> dict[str, str]:
    """The About card's terms and what each says, as the page shows them."""
    card = page.locator("#about dl.about")
    return dict(zip(card.locator("dt").all_inner_texts(), card.locator("dd").all_inner_texts()))


def open_editor(page):
    page.locator("#about summary", has_text="Edit").click()
    return page.locator("#about-form")


def test_a_member_edits_the_about_a_refusal_keeps_what_was_typed_and_a_viewer_only_reads(page, live_server):
    team = make_team()
    dataset = make_ready_version(team.project, user=team.teammate).dataset
    url = f"{live_server.url}/p/alpha/datasets/{dataset.public_id}/"
    log_in(page, live_server.url, team.teammate.username)
    page.goto(url)
    assert about(page)["Licence"].startswith("not stated")

    form = open_editor(page)
    form.locator("#id_source").fill("https://data.example/chats")
    form.locator("#id_licence").fill("cc-by-4.0")
    form.locator("#id_description").fill(DESCRIPTION)
    form.get_by_role("button", name="Save").click()
    page.wait_for_url(f"{url}#about")  # the form posts to #about, which the redirect keeps
    assert page.locator(".messages").inner_text() == "Saved what \u2068chats\u2069 is about."  # the name isolated
    assert about(page) == {"Source": "https://data.example/chats", "Licence": "cc-by-4.0",
                           "Description": "Support chats <b>kept</b> as written.\nOne a line."}
    assert page.locator("#about dd.description b").count() == 0  # the tag is text
    assert page.locator("#about dl.about a").get_attribute("href") == "https://data.example/chats"

    # A licence longer than its box lets one type (sent by a browser that ignores maxlength): refused beside it, what
    # was typed kept in the form.
    form = open_editor(page)
    form.locator("#id_licence").evaluate("box => box.removeAttribute('maxlength')")
    form.locator("#id_source").fill("org/chats")
    form.locator("#id_licence").fill("a" * 101)  # the limit is 100
    form.get_by_role("button", name="Save").click()
    page.locator("#about-form .has-error").wait_for()
    assert page.locator("#about details").evaluate("details => details.open")
    assert page.locator("#id_licence_error").inner_text() == "Ensure this value has at most 100 characters (it has 101)."
    assert page.input_value("#id_licence") == "a" * 101 and page.input_value("#id_source") == "org/chats"
    assert page.input_value("#id_description") == DESCRIPTION
    dataset.refresh_from_db()
    assert (dataset.source, dataset.licence) == ("https://data.example/chats", "cc-by-4.0")  # nothing half-saved

    # A description of line breaks within the box's limit, which the browser sends as CR LF, is not refused as longer.
    lines = "\n".join(f"line {number:04}" for number in range(195))  # 1,949 characters (2,000 at most), 2,143 sent
    form = page.locator("#about-form")
    form.locator("#id_licence").fill("cc-by-4.0")
    form.locator("#id_description").fill(lines)
    form.get_by_role("button", name="Save").click()
    page.wait_for_url(f"{url}#about")  # the form posts to #about, which the redirect keeps
    assert Dataset.objects.get(pk=dataset.pk).description == lines

    log_out(page)
    log_in(page, live_server.url, team.viewer.username)
    page.goto(url)
    assert about(page)["Source"] == "org/chats" and about(page)["Licence"] == "cc-by-4.0"
    assert page.locator("#about-form").count() == 0 and page.locator("#about summary").count() == 0
