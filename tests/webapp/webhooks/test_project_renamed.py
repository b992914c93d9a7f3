"""``project.renamed``, end to end against a real HTTP server: an owner renaming the project on its Settings page or
by the REST API tells the hooks subscribed to it, once, with the old and the new name and who renamed it; a change of
the description alone, a save that changes nothing, or a refused name send nothing; another project's hooks hear
nothing; the Webhooks page offers the event."""
from __future__ import annotations

from django.test import Client

from tests.webapp.webhooks.conftest import SITE, hook
from webapp.api.services import token_create
from webapp.webhooks.models import EVENT_GROUPS

SETTINGS = "/p/alpha/settings/"


def renames(team, receiver) -> None:
    hook(team.project, receiver, "/renamed", ["project.renamed"])
    hook(team.project, receiver, "/slack", ["project.renamed"], format="slack")
    hook(team.project, receiver, "/runs", ["run.succeeded", "run.failed"])
    hook(team.outsider_project, receiver, "/elsewhere", ["project.renamed"])


def test_a_rename_on_the_settings_page_tells_the_hooks_subscribed_to_it_once(
        team, client_for, receiver, sent, django_capture_on_commit_callbacks):
    renames(team, receiver)
    owner = client_for(team.owner)
    with django_capture_on_commit_callbacks(execute=True):
        assert owner.post(SETTINGS, {"name": "<b>Reward</b> & co", "description": ""}).status_code == 302
    with django_capture_on_commit_callbacks(execute=True):  # the same save again, then the description alone
        owner.post(SETTINGS, {"name": "<b>Reward</b> & co", "description": ""})
        owner.post(SETTINGS, {"name": "<b>Reward</b> & co", "description": "now described"})
        assert owner.post(SETTINGS, {"name": "Bad\u200bname", "description": ""}).status_code == 400
    assert sorted(received.path for received in receiver.requests) == ["/renamed", "/slack"]
    (sent_json,) = receiver.at("/renamed")
    assert sent_json.headers["X-Temper-Event"] == "project.renamed"
    assert (sent_json.json["event"], sent_json.json["project"]) == ("project.renamed", "alpha")
    assert sent_json.json["object"] == {
        "type": "project", "id": "alpha", "name": "<b>Reward</b> & co", "status": "renamed",
        "name_was": "Project alpha", "actor": "alpha-owner", "url": f"{SITE}/p/alpha/", "error": ""}
    (slack,) = receiver.at("/slack")
    assert slack.json == {"text": f"[alpha] Project <{SITE}/p/alpha/|&lt;b&gt;Reward&lt;/b&gt; &amp; co> renamed: "
                                  "was Project alpha, by alpha-owner"}


def test_a_rename_by_the_rest_api_tells_them_too(team, client, receiver, sent, django_capture_on_commit_callbacks):
    renames(team, receiver)
    api = Client(headers={"Authorization": f"Bearer {token_create(user=team.owner, name='t')[1]}"})
    with django_capture_on_commit_callbacks(execute=True):
        answer = api.patch("/api/v1/projects/alpha/", {"name": "Reward models"}, content_type="application/json")
    assert answer.status_code == 200
    (sent_json,) = receiver.at("/renamed")
    assert (sent_json.json["object"]["name"], sent_json.json["object"]["name_was"]) == ("Reward models",
                                                                                     "Project alpha")


def test_the_webhooks_page_and_the_openapi_document_offer_it(team, client_for, client):
    assert "project.renamed" in EVENT_GROUPS["Project"]
    page = client_for(team.owner).get("/p/alpha/webhooks/").content.decode()
    assert 'value="project.renamed"' in page and "an owner renames the project." in page
    schemas = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert "project.renamed" in schemas["WebhookCreate"]["properties"]["events"]["items"]["enum"]
