"""An owner adds a webhook on the project's Webhooks page, presses Send test and reads the delivery's 200 there; the
message reached a real HTTP server, signed with the secret the page shows."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.test_projects import log_in
from tests.webapp.factories import make_team
from tests.webapp.webhooks.receiver import running_receiver, verified  # noqa: F401 (a fixture)
from webapp.webhooks.models import Webhook

pytestmark = pytest.mark.browser


def test_an_owner_adds_a_webhook_sends_a_test_and_sees_it_delivered(page, live_server, receiver):
    make_team()
    log_in(page, live_server.url, "alpha-owner")
    page.goto(f"{live_server.url}/p/alpha/")
    page.get_by_role("navigation", name="Project").get_by_role("link", name="Webhooks").click()
    expect(page.locator("#no-webhooks")).to_be_visible()

    page.get_by_label("Payload URL").fill(f"{receiver.url}/hooks/temper?<b>x</b>")
    page.get_by_label("A dataset version failed its check").check()
    page.get_by_role("button", name="Add webhook").click()
    webhook = Webhook.objects.get()
    card = page.locator(f"section[data-webhook='{webhook.public_id}']")
    expect(card.locator(".webhook-url")).to_have_text(f"{receiver.url}/hooks/temper?<b>x</b>")
    expect(card.locator(".webhook-events")).to_have_text("run.succeeded, run.failed, dataset_version.failed")

    card.get_by_role("button", name="Send test").click()
    expect(page.get_by_text("Test message delivered: HTTP 200.")).to_be_visible()
    row = page.locator(f"section[data-webhook='{webhook.public_id}'] table.deliveries tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator(".delivery-status")).to_have_text("delivered")
    expect(row.locator(".delivery-code")).to_have_text("200")
    # QA: the receiver's answer (200 characters kept, most of them one unbroken word, as a JSON answer or a token is)
    # stretched the table past the card, Redeliver out of sight behind a scroll bar.
    card_box, button_box = card.bounding_box(), row.get_by_role("button", name="Redeliver").bounding_box()
    assert button_box["x"] + button_box["width"] <= card_box["x"] + card_box["width"], (button_box, card_box)

    card = page.locator(f"section[data-webhook='{webhook.public_id}']")
    card.get_by_text("Show").click()
    secret = card.locator(".webhook-secret").inner_text()
    received, = receiver.requests
    assert received.path == "/hooks/temper?<b>x</b>"  # the address as the owner gave it
    assert verified(secret, received) and received.json["event"] == "ping"
    assert received.json["object"]["url"] == f"{live_server.url}/p/alpha/webhooks/"


def test_on_a_narrow_screen_a_slack_address_asks_for_the_slack_format_and_the_form_reads_left_to_right(page_at,
                                                                                                     live_server):
    """QA (an owner setting up Slack on a phone, 400 px): the Active checkbox stood alone mid-card, away from its
    label (a ``.field`` stretches what it holds); a Slack address with the JSON format is refused naming the format."""
    make_team()
    page = page_at(400, 800)
    log_in(page, live_server.url, "alpha-owner")
    page.goto(f"{live_server.url}/p/alpha/webhooks/")
    label = page.locator("label[for=id_active]").bounding_box()
    checkbox = page.locator("#id_active").bounding_box()
    assert abs(checkbox["x"] - label["x"]) < 8 and checkbox["width"] < 40, (checkbox, label)  # not stretched
    assert page.evaluate("document.documentElement.scrollWidth") <= 400

    page.get_by_label("Payload URL").fill("https://hooks.slack.com/services/T0/B0/abc")
    page.get_by_role("button", name="Add webhook").click()
    expect(page.locator(".field.has-error .error")).to_contain_text("choose the Slack format")
    assert not Webhook.objects.exists()
    page.get_by_label("Format").select_option("slack")
    page.get_by_role("button", name="Add webhook").click()
    expect(page.get_by_text("use Send test to check it")).to_be_visible()
    assert Webhook.objects.get().format == "slack"
