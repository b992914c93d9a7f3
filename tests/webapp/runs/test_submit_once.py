"""Launching is idempotent on the server: the launch form's one-time token makes a second identical
POST (a script, a retrying proxy, Back and send again) land on the run the first made, with no
second run and no second task; the API does the same for a repeated ``Idempotency-Key`` (runs,
pipelines, dataset uploads)."""
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.webapp.factories import form_token
from tests.webapp.runs.conftest import sft_spec
from webapp.api.services import token_create
from webapp.core.models import Submission
from webapp.core.submissions import ALREADY_SENT, TOKEN_FIELD
from webapp.datasets.models import DatasetVersion
from webapp.runs import services
from webapp.runs.models import Pipeline, Run

NEW = "/p/alpha/runs/new/"


def token_of(page: str, form_id: str = "launch-form") -> str:
    return form_token(page, after=f'id="{form_id}"')


@pytest.fixture
def launch_form(team, catalog, client_for):
    """The fields the launch page's form sends, with the token it was rendered with."""
    page = client_for(team.teammate).get(NEW + "?task=sft").content.decode()
    return {"mode": "form", "task": "sft", "name": "once", "model": catalog.base_model.public_id,
            "data.train": catalog.sft.public_id, "peft.targets": ["q_proj", "v_proj"], "train.max_steps": "3",
            TOKEN_FIELD: token_of(page)}


@pytest.fixture
def client_for(client_for, django_capture_on_commit_callbacks):
    """Clients whose POSTs commit: the tasks a launch queues on commit are sent (to ``sent_tasks``)."""
    def build(user):
        client = client_for(user)
        post = client.post

        def committed_post(*args, **kwargs):
            with django_capture_on_commit_callbacks(execute=True):
                return post(*args, **kwargs)

        client.post = committed_post
        return client

    return build


def test_the_same_launch_sent_twice_queues_one_run(team, launch_form, client_for, sent_tasks):
    client = client_for(team.teammate)
    first = client.post(NEW, launch_form)
    second = client.post(NEW, launch_form)
    run = Run.objects.get()
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"] == f"/p/alpha/runs/{run.public_id}/"
    assert len(sent_tasks.calls) == 1
    assert ALREADY_SENT in client.get(second["Location"]).content.decode()


def test_the_yaml_view_sends_once_too(team, catalog, client_for, sent_tasks):
    client = client_for(team.teammate)
    page = client.get(NEW).content.decode()
    form = {"mode": "yaml", "task": "sft", TOKEN_FIELD: token_of(page, "yaml-form"),
            "spec_yaml": services.spec_to_yaml(sft_spec(catalog))}
    assert client.post(NEW, form)["Location"] == client.post(NEW, form)["Location"]
    assert Run.objects.count() == 1 and len(sent_tasks.calls) == 1


def test_a_changed_form_sent_with_the_same_token_is_a_new_launch(team, launch_form, client_for, sent_tasks):
    client = client_for(team.teammate)
    first = client.post(NEW, launch_form)
    second = client.post(NEW, {**launch_form, "train.max_steps": "4"})  # Back, edit, Launch
    assert first["Location"] != second["Location"]
    assert sorted(Run.objects.values_list("total_steps", flat=True)) == [3, 4] and len(sent_tasks.calls) == 2


def test_a_launch_that_failed_leaves_its_token_unspent(team, launch_form, client_for, sent_tasks):
    client = client_for(team.teammate)
    assert client.post(NEW, {**launch_form, "model": ""}).status_code == 400
    assert not Submission.objects.exists()
    assert client.post(NEW, {**launch_form, "model": ""}).status_code == 400  # still an error, not a redirect
    assert client.post(NEW, launch_form).status_code == 302 and Run.objects.count() == 1


def test_each_user_has_their_own_tokens(team, launch_form, client_for, sent_tasks):
    client_for(team.teammate).post(NEW, launch_form)
    client_for(team.owner).post(NEW, launch_form)  # a token copied into another account's POST
    assert sorted(Run.objects.values_list("created_by__username", flat=True)) == sorted(
        [team.teammate.username, team.owner.username])


def test_a_post_without_a_token_launches_every_time(team, launch_form, client_for, sent_tasks):
    client = client_for(team.teammate)
    form = {key: value for key, value in launch_form.items() if key != TOKEN_FIELD}
    client.post(NEW, form), client.post(NEW, form)
    assert Run.objects.count() == 2


def test_the_same_pipeline_sent_twice_starts_one(team, catalog, client_for, sent_tasks):
    client = client_for(team.teammate)
    page = client.get("/p/alpha/pipelines/new/").content.decode()
    token = form_token(page)
    document = (f"name: once\nstages:\n  - name: sft\n    spec:\n      task: sft\n      model: {catalog.base_model.public_id}\n"
                f"      data: {{train: {catalog.sft.public_id}}}\n      train: {{max_steps: 3}}\n")
    first = client.post("/p/alpha/pipelines/new/", {"document": document, TOKEN_FIELD: token})
    second = client.post("/p/alpha/pipelines/new/", {"document": document, TOKEN_FIELD: token})
    assert first.status_code == second.status_code == 302 and first["Location"] == second["Location"]
    assert Pipeline.objects.count() == 1 and Run.objects.count() == 1 and len(sent_tasks.calls) == 1


def test_the_api_launches_once_per_idempotency_key(team, catalog, client_for, sent_tasks):
    _token, secret = token_create(user=team.teammate, name="script")
    body = json.dumps({"spec": {"task": "sft", "model": catalog.base_model.public_id,
                                "data": {"train": catalog.sft.public_id}, "train": {"max_steps": 3}}})
    client = client_for(team.teammate)

    def post(**headers):
        return client.post("/api/v1/projects/alpha/runs/", body, content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {secret}", **headers)

    first, second = post(HTTP_IDEMPOTENCY_KEY="retry-1"), post(HTTP_IDEMPOTENCY_KEY="retry-1")
    assert first.status_code == second.status_code == 201
    assert first.json()["id"] == second.json()["id"] == Run.objects.get().public_id
    assert "Idempotent-Replayed" not in first and second["Idempotent-Replayed"] == "true"
    assert len(sent_tasks.calls) == 1
    assert post().json()["id"] != first.json()["id"]  # no key: a new run every time
    assert Run.objects.count() == 2


def test_the_api_starts_a_pipeline_once_per_idempotency_key(team, catalog, client_for, sent_tasks):
    _token, secret = token_create(user=team.teammate, name="script")
    body = json.dumps({"name": "once", "stages": [{"name": "sft", "spec": sft_spec(catalog)}]})
    client = client_for(team.teammate)
    responses = [client.post("/api/v1/projects/alpha/pipelines/", body, content_type="application/json",
                             HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_IDEMPOTENCY_KEY="p-1") for _ in range(2)]
    assert [response.status_code for response in responses] == [201, 201]
    assert responses[0].json()["id"] == responses[1].json()["id"] == Pipeline.objects.get().public_id
    assert Run.objects.count() == 1 and len(sent_tasks.calls) == 1


def test_the_api_uploads_once_per_idempotency_key(team, client_for, sent_tasks):
    _token, secret = token_create(user=team.teammate, name="script")
    client = client_for(team.teammate)

    def upload(content=b'{"prompt": "a", "completion": "b"}\n'):
        return client.post("/api/v1/projects/alpha/datasets/", {
            "name": "chats", "kind": "sft", "file": SimpleUploadedFile("chats.jsonl", content)},
            HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_IDEMPOTENCY_KEY="u-1")

    first, second = upload(), upload()  # the second is not "alpha already has a dataset named 'chats'"
    assert first.status_code == second.status_code == 201, second.content
    assert first.json()["version"]["id"] == second.json()["version"]["id"] == DatasetVersion.objects.get().public_id
    assert second["Idempotent-Replayed"] == "true"


REUSED = ("Idempotency-Key reused with a different request body: this key was first sent to {path} with another "
          "body, and that request is the one it stands for. Send a new key for a new request, or the first body "
          "again to get what it made.")


def test_an_idempotency_key_sent_again_with_another_body_is_refused(team, catalog, client_for, sent_tasks):
    """QA: the same key with a different body made a second run (the body was part of what the key was
    stored under), so a client that reused a key by mistake got a new object and no word. The key stands for
    its first request: another body under it is a 422 (IETF idempotency-key draft, as Stripe), and the
    first body again still gets what it made."""
    _token, secret = token_create(user=team.teammate, name="script")
    client = client_for(team.teammate)

    def launch(max_steps, key="k-1"):
        spec = {"task": "sft", "model": catalog.base_model.public_id, "data": {"train": catalog.sft.public_id},
                "train": {"max_steps": max_steps}}
        return client.post("/api/v1/projects/alpha/runs/", json.dumps({"spec": spec}), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_IDEMPOTENCY_KEY=key)

    first, other = launch(3), launch(4)
    assert first.status_code == 201
    assert other.status_code == 422 and other.json() == {
        "errors": {"Idempotency-Key": [REUSED.format(path="/api/v1/projects/alpha/runs/")]}}
    again = launch(3)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] == Run.objects.get().public_id and len(sent_tasks.calls) == 1
    # A request refused (a 400) leaves no record: the key is free for the corrected body.
    assert launch(0, key="k-2").status_code == 400
    assert launch(5, key="k-2").status_code == 201 and Run.objects.count() == 2

    def upload(content):
        return client.post("/api/v1/projects/alpha/datasets/", {
            "name": "uploaded", "kind": "sft", "file": SimpleUploadedFile("chats.jsonl", content)},
            HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_IDEMPOTENCY_KEY="u-1")

    rows = b'{"prompt": "a", "completion": "b"}\n'
    assert upload(rows).status_code == 201
    changed = upload(rows + rows)
    assert changed.status_code == 422 and changed.json() == {
        "errors": {"Idempotency-Key": [REUSED.format(path="/api/v1/projects/alpha/datasets/")]}}
    assert DatasetVersion.objects.filter(dataset__name="uploaded").count() == 1 and upload(rows).status_code == 201


def test_retry_and_export_sent_twice_act_once(team, catalog, client_for, sent_tasks):
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate)
    Run.objects.filter(pk=run.pk).update(status="failed")
    (run.output_dir / "checkpoints" / "3").mkdir(parents=True)
    client = client_for(team.teammate)
    page = client.get(f"/p/alpha/runs/{run.public_id}/").content.decode()
    for action, fields in (("retry", {}), ("export", {"step": "3"})):
        fields[TOKEN_FIELD] = form_token(page, after=f'action="/p/alpha/runs/{run.public_id}/{action}/"')
        first, second = (client.post(f"/p/alpha/runs/{run.public_id}/{action}/", fields) for _ in range(2))
        assert first.status_code == second.status_code == 302 and first["Location"] == second["Location"], action
    assert Run.objects.count() == 2  # the run and one retry
    assert [name for name, _args, _queue in sent_tasks.calls] == [
        "worker.tasks.train.train_run", "worker.tasks.train.export_checkpoint"]


def test_an_idempotency_key_is_scoped_to_its_user_and_project_and_a_long_one_is_refused(team, catalog, client_for,
                                                                                        sent_tasks):
    body = json.dumps({"spec": {"task": "sft", "model": catalog.base_model.public_id,
                                "data": {"train": catalog.sft.public_id}, "train": {"max_steps": 3}}})

    def post(user, key, project="alpha"):
        _token, secret = token_create(user=user, name="script")
        return client_for(user).post(f"/api/v1/projects/{project}/runs/", body, content_type="application/json",
                                     HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_IDEMPOTENCY_KEY=key)

    first = post(team.teammate, "k-1")
    assert first.status_code == 201
    # The outsider replaying the member's key learns nothing of alpha: 404, as for any other request.
    outsider = post(team.outsider, "k-1")
    assert outsider.status_code == 404 and "Idempotent-Replayed" not in outsider
    assert Run.objects.filter(project=team.project).count() == 1
    too_long = post(team.teammate, "k" * 201)
    assert too_long.status_code == 400
    assert list(too_long.json()["errors"]) == ["Idempotency-Key"]
    assert Run.objects.filter(project=team.project).count() == 1 and len(sent_tasks.calls) == 1


def test_a_sweep_sent_twice_launches_its_runs_once(team, launch_form, client_for, sent_tasks):
    client = client_for(team.teammate)
    form = {**launch_form, "peft.method": "lora", "sweep": "peft.rank: 4, 8\noptim.learning_rate: 1e-4, 1e-3"}
    first, second = client.post(NEW, form), client.post(NEW, form)
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"] and "?tag=sweep-" in first["Location"]
    assert Run.objects.count() == 4 and len(sent_tasks.calls) == 4
    assert ALREADY_SENT in client.get(second["Location"]).content.decode()


def test_the_api_launches_a_sweep_once_per_idempotency_key(team, catalog, client_for, sent_tasks):
    _token, secret = token_create(user=team.teammate, name="script")
    body = json.dumps({"spec": sft_spec(catalog, peft={"method": "lora"}), "sweep": {"peft.rank": [4, 8]}})
    client = client_for(team.teammate)
    first, second = [client.post("/api/v1/projects/alpha/runs/", body, content_type="application/json",
                                 HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_IDEMPOTENCY_KEY="sweep-1")
                     for _ in range(2)]
    assert first.status_code == second.status_code == 201 and second["Idempotent-Replayed"] == "true"
    assert first.json() == second.json()
    assert [run["id"] for run in first.json()["runs"]] == list(Run.objects.order_by("id").values_list("public_id", flat=True))
    assert Run.objects.count() == 2 and len(sent_tasks.calls) == 2


def test_a_launch_and_an_upload_sent_twice_at_once_are_made_once(transactional_db, team, catalog, sent_tasks):
    """Two identical requests at the same moment (a client's retry while the first still works), each on its own
    connection: one run, one dataset, and the second answered with the first's."""
    from tests.webapp.basemodels.test_upload_views import sent_at_once

    secret = token_create(user=team.teammate, name="script")[1]
    body = json.dumps({"spec": sft_spec(catalog)})

    def launch(client):
        return client.post("/api/v1/projects/alpha/runs/", body, content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_IDEMPOTENCY_KEY="launch-at-once")

    def upload(client):
        return client.post("/api/v1/projects/alpha/datasets/", {
            "name": "at-once", "kind": "sft", "file": SimpleUploadedFile("c.jsonl", b'{"prompt": "a", "completion": "b"}\n')},
            HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_IDEMPOTENCY_KEY="upload-at-once")

    for send, made in ((launch, lambda: Run.objects.get().public_id),
                       (upload, lambda: DatasetVersion.objects.get(dataset__name="at-once").dataset.public_id)):
        first, second = sent_at_once(send, send)
        assert (first.status_code, second.status_code) == (201, 201), (first.content, second.content)
        ids = [answer.json()["id"] if send is launch else answer.json()["dataset"]["id"] for answer in (first, second)]
        assert ids == [made()] * 2
        assert sorted(answer.get("Idempotent-Replayed", "") for answer in (first, second)) == ["", "true"]
    assert len(sent_tasks.calls) == 2  # the run's task and the dataset's check, each queued once
