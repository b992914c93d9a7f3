"""Webhook changes are security matters (they decide where the project's data is sent): each is logged once, by its
own service, through the owners' Webhooks page, with what changed but never the secret nor the whole address (a
chat's incoming-webhook address is a secret itself, and every member reads the log); a refused change logs nothing.
On the Activity page and in the API a hook links to its edit page for owners only."""
import re

from tests.webapp.activity.test_page import API, PAGE, api_get
from tests.webapp.activity.test_recording import logged
from webapp.activity.models import Activity, Verb
from webapp.webhooks import services
from webapp.webhooks.models import Webhook

HOOKS = "/p/alpha/webhooks/"
SECRET_PATH = "https://hooks.example.org/services/T000/B000/not-for-members"


def added(client) -> Webhook:
    response = client.post(HOOKS, {"url": SECRET_PATH, "events": ["run.failed", "export.failed"], "format": "slack",
                                   "active": "on"})
    assert response.status_code == 302
    return Webhook.objects.get()


def test_adding_editing_a_new_secret_and_deleting_a_hook_are_each_logged_once(team, client_for):
    owner = client_for(team.owner)
    webhook = added(owner)
    edit = f"{HOOKS}{webhook.public_id}/"
    assert owner.post(edit, {"url": SECRET_PATH, "events": ["run.failed", "export.failed"], "format": "slack",
                             "active": "on"}).status_code == 302  # saved unchanged: nothing to log
    assert owner.post(edit, {"url": "https://chat.example.net/hooks/other-secret", "events": ["export.ready"],
                             "format": "slack"}).status_code == 302  # "active" unticked
    owner.post(f"{edit}secret/")
    owner.post(f"{edit}delete/")

    hook_id = webhook.public_id
    assert logged() == [("alpha-owner", Verb.WEBHOOK_CREATED, "webhook", hook_id),
                        ("alpha-owner", Verb.WEBHOOK_CHANGED, "webhook", hook_id),
                        ("alpha-owner", Verb.WEBHOOK_SECRET_REGENERATED, "webhook", hook_id),
                        ("alpha-owner", Verb.WEBHOOK_DELETED, "webhook", hook_id)]
    created, changed, regenerated, deleted = Activity.objects.order_by("id")
    assert created.details == {"events": ["run.failed", "export.failed"], "format": "slack"}
    assert changed.details == {"changed": ["url", "events", "active"], "host": "chat.example.net",
                               "events": ["export.ready"], "active": False}
    assert (created.target_label, changed.target_label, deleted.target_label) == (
        "hooks.example.org", "chat.example.net", "chat.example.net")
    assert regenerated.details == {}
    written = repr([(entry.target_label, entry.details) for entry in Activity.objects.all()])
    assert "not-for-members" not in written and "other-secret" not in written and "whsec_" not in written


def test_refused_webhook_changes_log_nothing(team, client_for):
    owner = client_for(team.owner)
    assert owner.post(HOOKS, {"url": "ftp://example.org/", "events": ["run.failed"],
                              "format": "json"}).status_code == 400
    webhook = services.webhook_create(project=team.project, url=SECRET_PATH, events=["run.failed"], format="json",
                                      user=team.owner)
    Activity.objects.all().delete()
    edit = f"{HOOKS}{webhook.public_id}/"
    assert owner.post(edit, {"url": "gopher://example.org/", "events": ["run.failed"],
                             "format": "json"}).status_code == 400
    for user in (team.teammate, team.viewer):  # not owners: 403, nothing changed or logged
        for action in ("", "secret/", "delete/"):
            assert client_for(user).post(f"{edit}{action}", {"url": "https://example.org/", "events": ["run.failed"],
                                                               "format": "json"}).status_code == 403
    assert client_for(team.outsider).post(f"{edit}delete/").status_code == 404
    assert logged() == []
    assert Webhook.objects.get().url == SECRET_PATH


def what_cell(page: str, target: str) -> str:
    """The "What" cell of the row about ``target``."""
    return re.search(rf'data-target="{target}">.*?<td class="what">(.*?)</td>', page, re.S).group(1)


def test_a_hook_links_to_its_edit_page_for_owners_only(team, client_for, client):
    webhook = added(client_for(team.owner))
    edit = f"{HOOKS}{webhook.public_id}/"

    owners = what_cell(client_for(team.owner).get(PAGE).content.decode(), webhook.public_id)
    assert f'<a href="{edit}">hooks.example.org</a>' in owners
    for user in (team.teammate, team.viewer):
        theirs = what_cell(client_for(user).get(PAGE).content.decode(), webhook.public_id)
        assert "<a " not in theirs and '<span class="target-label">hooks.example.org</span>' in theirs
        assert "(deleted)" not in theirs and "not-for-members" not in theirs

    def api_target(user) -> dict:
        return api_get(client, user, API).json()["activity"][0]["target"]

    assert api_target(team.owner)["url"] == f"http://testserver{edit}"
    assert api_target(team.teammate) == {"kind": "webhook", "id": webhook.public_id, "label": "hooks.example.org",
                                         "exists": True, "url": None}
    services.webhook_delete(webhook=webhook, user=team.owner)
    owners = what_cell(client_for(team.owner).get(PAGE).content.decode(), webhook.public_id)
    assert "<a " not in owners and "(deleted)" in owners


def test_a_hook_turned_off_reads_in_words_in_the_log(team, client_for):
    """QA (a member reading the log): a hook turned off read "active: False", Python's word for it."""
    owner = client_for(team.owner)
    webhook = added(owner)
    assert owner.post(f"{HOOKS}{webhook.public_id}/", {"url": SECRET_PATH, "events": ["run.failed", "export.failed"],
                                                       "format": "slack"}).status_code == 302  # "active" unticked
    page = client_for(team.viewer).get(PAGE).content.decode()
    details = re.search(r'<small class="muted details">(.*?)</small>', page).group(1)
    # In the order the database gives the keys (PostgreSQL's jsonb: by length).
    assert sorted(details.split("; ")) == ["active: no", "changed: active"]
