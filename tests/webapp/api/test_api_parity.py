"""The REST API's webhooks, model cards and project-wide checkpoint prune: what their pages do, through tokens, by the
same services and with the same refusals (the page tests are tests/webapp/webhooks/ and tests/webapp/runs/)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from pydantic import TypeAdapter

from tests.webapp.factories import make_base_model, make_ready_version
from tests.webapp.webhooks.receiver import running_receiver, verified  # noqa: F401 (a fixture)
from webapp.api import schemas
from webapp.runs import services as run_services
from webapp.runs.artifacts import MODEL_CARD_MAX_BYTES
from webapp.runs.models import Artifact, ArtifactKind, ProjectCheckpointPrune, Run
from webapp.webhooks.models import Webhook, WebhookDelivery

BASE = "/api/v1/projects/alpha"


def valid(schema: str, body) -> None:
    """``body`` is what the OpenAPI document says the answer is (strict, no key left over)."""
    TypeAdapter(getattr(schemas, schema)).validate_json(json.dumps(body))


def test_an_owner_adds_lists_edits_tests_and_deletes_a_webhook(world, receiver):
    _team, apis, _sent = world
    api = apis["owner"]
    status, hook = api.call("POST", f"{BASE}/webhooks/", {"url": receiver.url + "/ci", "events": ["run.failed"]})
    assert status == 201, hook
    valid("WebhookOut", hook)
    assert (hook["url"], hook["events"], hook["format"], hook["active"]) == (receiver.url + "/ci", ["run.failed"],
                                                                           "json", True)
    assert hook["secret"].startswith("whsec_") and hook["secret"] == Webhook.objects.get().secret
    path = f"{BASE}/webhooks/{hook['id']}/"
    status, listed = api.call("GET", f"{BASE}/webhooks/")
    assert status == 200 and [one["id"] for one in listed["webhooks"]] == [hook["id"]]
    valid("WebhookList", listed)
    assert api.call("GET", path) == (200, hook)

    status, edited = api.call("PATCH", path, {"events": ["run.succeeded", "run.failed"], "format": "slack"})
    assert status == 200 and (edited["events"], edited["format"], edited["url"]) == (
        ["run.succeeded", "run.failed"], "slack", hook["url"])
    status, renewed = api.call("POST", path + "secret/")
    assert status == 200 and renewed["secret"] != hook["secret"]
    valid("WebhookOut", renewed)

    # Send test: the ping is POSTed in the request, signed with the new secret, and answered as sent.
    status, ping = api.call("POST", path + "test/", {"format": "json"})
    assert status == 400 and "format" in ping["errors"]  # no field: one sent is refused, not ignored
    status, ping = api.call("POST", path + "test/")
    assert status == 201, ping
    valid("DeliveryOut", ping)
    assert (ping["event"], ping["status"], ping["last_status_code"], ping["attempts"]) == ("ping", "delivered", 200, 1)
    assert len(receiver.requests) == 1 and verified(renewed["secret"], receiver.requests[0])

    # Redeliver: a new delivery of the same payload; the list is newest first, a page at a time.
    status, again = api.call("POST", path + f"deliveries/{ping['id']}/redeliver/")
    assert status == 201 and again["id"] != ping["id"] and again["payload"] == ping["payload"], again
    status, page = api.call("GET", path + "deliveries/?limit=1")
    assert status == 200 and [one["id"] for one in page["deliveries"]] == [again["id"]] and page["next"]
    valid("DeliveryList", page)
    status, older = api.call("GET", page["next"].removeprefix(api.base))
    assert status == 200 and [one["id"] for one in older["deliveries"]] == [ping["id"]] and older["next"] is None
    assert api.call("POST", path + "deliveries/whd_missing/redeliver/")[0] == 404

    assert api.call("DELETE", path)[0] == 204
    assert not Webhook.objects.exists() and not WebhookDelivery.objects.exists()
    assert api.call("GET", path)[0] == 404


def test_a_refused_webhook_names_the_field_and_saves_nothing(world, settings):
    _team, apis, _sent = world
    api = apis["owner"]
    settings.TEMPER_WEBHOOK_ALLOWED_NETWORKS = ()
    refusals = [
        ({"url": "ftp://example.org/x", "events": ["run.failed"]}, "url", "only http:// and https://"),
        # The address guard (webapp/webhooks/network.py): the cloud metadata service is not a public address.
        ({"url": "http://169.254.169.254/latest", "events": ["run.failed"]}, "url", "TEMPER_WEBHOOK_ALLOWED_NETWORKS"),
        ({"url": "https://example.org/x", "events": ["run.exploded"]}, "events", "unknown events run.exploded"),
        ({"url": "https://example.org/x", "events": []}, "events", "tick at least one event"),
        ({"url": "https://example.org/x", "events": ["run.failed"], "format": "xml"}, "format", "'xml' is not a format"),
        ({"url": "https://example.org/x", "events": "run.failed"}, "events", "is not a JSON array"),
    ]
    for body, field, said in refusals:
        status, answer = api.call("POST", f"{BASE}/webhooks/", body)
        assert status == 400 and list(answer["errors"]) == [field] and said in answer["errors"][field][0], answer
    assert not Webhook.objects.exists()

    _status, hook = api.call("POST", f"{BASE}/webhooks/", {"url": "https://example.org/x", "events": ["run.failed"]})
    path = f"{BASE}/webhooks/{hook['id']}/"
    status, answer = api.call("PATCH", path, {"url": "http://127.0.0.1:6379/", "events": ["run.succeeded"]})
    assert status == 400 and list(answer["errors"]) == ["url"], answer
    status, answer = api.call("PATCH", path, {"active": None})
    assert status == 400 and "leave the key out" in answer["errors"]["active"][0]
    assert api.call("GET", path) == (200, hook)  # all or nothing: the events were not changed either


def test_webhooks_are_the_owners_members_and_viewers_get_403_outsiders_404(world):
    team, apis, _sent = world
    webhook = Webhook.objects.create(project=team.project, url="https://example.org/x", events=["run.failed"])
    delivery = WebhookDelivery.objects.create(webhook=webhook, event="run.failed", payload={})
    path = f"{BASE}/webhooks/{webhook.public_id}/"
    calls = [("GET", f"{BASE}/webhooks/"), ("POST", f"{BASE}/webhooks/"), ("GET", path), ("PATCH", path),
             ("DELETE", path), ("POST", path + "secret/"), ("POST", path + "test/"), ("GET", path + "deliveries/"),
             ("POST", path + f"deliveries/{delivery.public_id}/redeliver/")]
    for method, address in calls:
        for role, expected in (("teammate", 403), ("viewer", 403), ("outsider", 404), ("anonymous", 401)):
            status, body = apis[role].call(method, address, {"url": "https://example.org/y"} if method != "GET" else None)
            assert status == expected and webhook.secret not in json.dumps(body), (role, method, address, body)
    webhook.refresh_from_db()
    assert webhook.url == "https://example.org/x" and Webhook.objects.count() == 1


def _get(api, path: str) -> tuple[int, str, bytes]:
    """Status, Content-Type and body of a GET that may answer other than JSON."""
    request = urllib.request.Request(api.base + path, headers={"Authorization": f"Bearer {api.token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


def test_an_artifacts_model_card_is_answered_as_markdown_and_linked_from_the_run(world):
    team, apis, _sent = world
    model, data = make_base_model(team.project), make_ready_version(team.project)
    spec = {"task": "sft", "model": model.public_id, "data": {"train": data.public_id}, "train": {"max_steps": 5}}
    _status, created = apis["teammate"].call("POST", f"{BASE}/runs/", {"spec": spec})
    run = Run.objects.get(public_id=created["id"])
    export, checkpoint, before_cards = (run.output_dir / name for name in ("export", "export-step-3", "export-step-2"))
    card = "---\nlicense: apache-2.0\n---\n# run one <script>x</script>\n\nTrained by Temper — ünïcode.\n"
    for folder in (export, checkpoint, before_cards):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    (export / "README.md").write_text(card, encoding="utf-8")
    (checkpoint / "README.md").write_text("# step 3\n", encoding="utf-8")
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=5, path=str(export))
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=3, path=str(checkpoint))
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=2, path=str(before_cards))
    runs = f"{BASE}/runs/{run.public_id}"

    status, detail = apis["viewer"].call("GET", f"{runs}/")
    valid("RunDetail", detail)
    cards = {(artifact["kind"], artifact["step"]): artifact["card_url"] for artifact in detail["artifacts"]}
    base = f"{apis['viewer'].base}{runs}/artifacts"
    assert cards == {("model", 5): f"{base}/model/card/", ("checkpoint", 3): f"{base}/checkpoint/card/?step=3",
                     ("checkpoint", 2): None}
    status, listed = apis["viewer"].call("GET", f"{runs}/checkpoints/")
    valid("CheckpointList", listed)
    assert {checkpoint["step"]: checkpoint["card_url"] for checkpoint in listed["checkpoints"]} == {
        2: None, 3: f"{base}/checkpoint/card/?step=3"}
    assert _get(apis["viewer"], f"{runs}/artifacts/model/card/") == (200, "text/markdown; charset=utf-8",
                                                                     card.encode())
    assert _get(apis["viewer"], f"{runs}/artifacts/checkpoint/card/?step=3")[2] == b"# step 3\n"

    # 404s in the API's shape, with the page's reasons.
    status, kind, body = _get(apis["viewer"], f"{runs}/artifacts/checkpoint/card/?step=2")
    assert (status, kind) == (404, "application/json") and "exported before exports had one" in json.loads(body)["detail"]
    status, _kind, body = _get(apis["viewer"], f"{runs}/artifacts/adapter/card/")
    assert status == 404 and "has no adapter artifact" in json.loads(body)["detail"]
    (export / "README.md").write_bytes(b"x" * (MODEL_CARD_MAX_BYTES + 1))
    status, _kind, body = _get(apis["viewer"], f"{runs}/artifacts/model/card/")
    assert status == 404 and "larger than the engine writes" in json.loads(body)["detail"]
    assert _get(apis["outsider"], f"{runs}/artifacts/checkpoint/card/?step=3")[0] == 404
    assert apis["viewer"].call("GET", f"{runs}/artifacts/model/card/?format=html")[0] == 400


def test_an_owner_prunes_the_projects_checkpoints_and_every_member_follows_it(world):
    team, apis, sent = world
    status, none = apis["viewer"].call("GET", f"{BASE}/storage/prune/")
    assert (status, none) == (200, {"prune": None})
    assert apis["teammate"].call("POST", f"{BASE}/storage/prune/")[0] == 403
    assert apis["viewer"].call("POST", f"{BASE}/storage/prune/")[0] == 403

    status, queued = apis["owner"].call("POST", f"{BASE}/storage/prune/")
    assert status == 202, queued
    valid("ProjectPruneState", queued)
    prune = ProjectCheckpointPrune.objects.get()
    assert queued["prune"]["state"] == "queued" and queued["prune"]["requested_by"] == team.owner.get_username()
    assert [team.project.pk, team.owner.pk, prune.pk] in sent  # the task that prunes, on the default queue

    status, refused = apis["owner"].call("POST", f"{BASE}/storage/prune/")
    assert status == 409 and "being pruned already" in refused["detail"], refused
    assert f"GET {BASE}/storage/prune/ follows it" in refused["detail"]
    assert ProjectCheckpointPrune.objects.count() == 1
    assert apis["viewer"].call("GET", f"{BASE}/storage/prune/") == (200, queued)

    run_services.project_checkpoints_prune(project=team.project, user=team.owner, progress=prune)  # the worker's
    status, done = apis["viewer"].call("GET", f"{BASE}/storage/prune/")
    valid("ProjectPruneState", done)
    assert status == 200 and done["prune"]["state"] == "finished" and done["prune"]["finished_at"]
    assert (done["prune"]["runs_done"], done["prune"]["runs_total"], done["prune"]["failures"]) == (0, 0, [])
    assert apis["owner"].call("POST", f"{BASE}/storage/prune/")[0] == 202  # finished: another may start
    assert apis["outsider"].call("GET", f"{BASE}/storage/prune/")[0] == 404
