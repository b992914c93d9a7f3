"""``POST base-models/`` of the REST API: an owner's model archive, unpacked into the project's own folder and
registered by the service the Upload page uses (``webapp.basemodels.uploads``); refused in JSON naming the field or
the archive's member, with nothing left behind; members and viewers get 403 and outsiders 404 before anything is
written; a repeat under one ``Idempotency-Key`` gets the first model; the ASGI guard takes a model-sized body at this
address from an owner's token only."""
from __future__ import annotations

import json
import shlex
import time
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.template.defaultfilters import filesizeformat
from django.test import Client
from pydantic import TypeAdapter

from tests.webapp.basemodels.test_upload_views import run_the_guard, sent_at_once, slowed_unpacking
from tests.webapp.basemodels.test_uploads import left_in, tar_of, zip_of
from tests.webapp.factories import make_team, write_model_dir
from webapp.api import schemas
from webapp.api.services import token_create
from webapp.basemodels.models import BaseModel
from webapp.datasets.uploads import MULTIPART_OVERHEAD_BYTES

URL = "/api/v1/projects/alpha/base-models/"
ROLES = ("owner", "teammate", "viewer", "outsider")
REUSED = ("Idempotency-Key reused with a different request body: this key was first sent to "
          "/api/v1/projects/alpha/base-models/ with another body, and that request is the one it stands for. Send a "
          "new key for a new request, or the first body again to get what it made.")


@pytest.fixture
def secrets(team) -> dict[str, str]:
    return {role: token_create(user=getattr(team, role), name="script")[1] for role in ROLES}


def post(client: Client, secret: str, fields: dict, *, key: str | None = None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(URL, fields, **headers)


def upload(archive: bytes, *, name: str = "uploaded", file_name: str = "tiny.zip") -> dict:
    return {"name": name, "archive": SimpleUploadedFile(file_name, archive)}


def nothing_kept(models_root) -> bool:
    return left_in(models_root) in ([], ["projects", "projects/alpha"]) and not BaseModel.objects.exists()


def test_it_works(team, models_root, archive_bytes, secrets, client):
    response = post(client, secrets["owner"], upload(archive_bytes))
    assert response.status_code == 201, response.content
    model = BaseModel.objects.get(project=team.project)
    body = response.json()
    assert (body["id"], body["name"], body["architecture"]) == (model.public_id, "uploaded", "LlamaForCausalLM")
    TypeAdapter(schemas.BaseModelOut).validate_json(json.dumps(body))  # what the OpenAPI document says a 201 holds
    assert model.path == str(models_root.resolve() / "projects" / "alpha" / "uploaded")
    assert model.registered_by == team.owner and "Idempotent-Replayed" not in response
    listed = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {secrets['viewer']}").json()
    assert [one["id"] for one in listed["base_models"]] == [model.public_id]


@pytest.mark.parametrize("role", ["teammate", "viewer"])
def test_it_requires_the_owner_role(team, models_root, archive_bytes, secrets, client, role):
    response = post(client, secrets[role], upload(archive_bytes))
    assert response.status_code == 403 and response.json()["detail"]
    assert left_in(models_root) == [] and not BaseModel.objects.exists()


def test_it_requires_access(team, models_root, archive_bytes, secrets, client):
    outsider = post(client, secrets["outsider"], upload(archive_bytes))
    missing = client.post("/api/v1/projects/no-such/base-models/", upload(archive_bytes),
                          HTTP_AUTHORIZATION=f"Bearer {secrets['outsider']}")
    assert outsider.status_code == missing.status_code == 404
    assert outsider.json() == missing.json() == {"detail": "no such project"}
    anonymous = client.post(URL, upload(archive_bytes))
    assert anonymous.status_code == 401 and "Bearer" in anonymous.json()["detail"]
    assert left_in(models_root) == [] and not BaseModel.objects.exists()


def test_it_rejects_an_archive_over_the_limit_as_it_arrives(team, models_root, archive_bytes, secrets, client,
                                                            settings):
    settings.TEMPER_MODEL_UPLOAD_MAX_BYTES = limit = len(archive_bytes) - 1
    response = post(client, secrets["owner"], upload(archive_bytes))
    assert response.status_code == 413
    assert response.json() == {"detail": f"the archive is over the {filesizeformat(limit)} model upload limit "
                                         "(TEMPER_MODEL_UPLOAD_MAX_BYTES); ask an administrator to raise it, or to "
                                         "copy the model under the models root"}
    assert left_in(models_root) == [] and not BaseModel.objects.exists()


def test_it_rejects_a_body_whose_length_alone_is_over_the_limit(team, models_root, secrets, client, settings):
    settings.TEMPER_MODEL_UPLOAD_MAX_BYTES = 10
    response = post(client, secrets["owner"], upload(b"x" * (MULTIPART_OVERHEAD_BYTES + 100)))
    assert response.status_code == 413 and "(TEMPER_MODEL_UPLOAD_MAX_BYTES)" in response.json()["detail"]
    assert left_in(models_root) == [] and not BaseModel.objects.exists()


@pytest.mark.parametrize("member", ["../escaped.txt", "/tmp/escaped-by-api.txt"])
def test_it_rejects_a_member_that_leaves_the_folder(team, models_root, tmp_path, secrets, client, member):
    archive = zip_of(tmp_path / "slip.zip", write_model_dir(tmp_path / "source" / "tiny"))
    with zipfile.ZipFile(archive, "a") as packed:
        packed.writestr(member, "outside")
    response = post(client, secrets["owner"], upload(archive.read_bytes(), file_name="slip.zip"))
    assert response.status_code == 400
    assert response.json() == {"errors": {"archive": [
        f"slip.zip: the member {member!r} would be written outside the model's folder (an absolute path or '..'); "
        "pack the model directory with paths relative to it"]}}
    assert nothing_kept(models_root)
    assert not list(tmp_path.rglob("escaped*")) and not (tmp_path.parent / "escaped.txt").exists()


def test_it_rejects_a_file_that_is_no_archive_naming_it(team, models_root, secrets, client):
    response = post(client, secrets["owner"], upload(b"<b>not a zip</b>", file_name="m.zip"))
    assert response.status_code == 400 and response.json() == {"errors": {"archive": [
        "m.zip: not a readable zip archive (File is not a zip file); pack it again"]}}
    assert nothing_kept(models_root)


def test_it_rejects_missing_repeated_and_unknown_fields_naming_them(team, models_root, archive_bytes, secrets, client):
    """Django's parser keeps the last of a field sent twice and drops a field no one reads, without a word."""
    owner = secrets["owner"]
    assert post(client, owner, {}).json() == {"errors": {
        "archive": ["attach the model archive (a .zip, .tar or .tar.gz of its directory) as the multipart field "
                    "'archive', e.g. curl -F archive=@my-model.tar.gz"],
        "name": ["send the model's name as the multipart field 'name' (also its folder's name: letters, digits, '.', "
                 "'_' and '-')"]}}
    two = post(client, owner, {"name": "uploaded", "archive": [SimpleUploadedFile("a.zip", archive_bytes),
                                                               SimpleUploadedFile("b.zip", archive_bytes)]})
    assert two.status_code == 400 and two.json() == {"errors": {"archive": [
        "2 files were sent: send the model as one archive (.zip, .tar or .tar.gz of its directory)"]}}
    names = post(client, owner, {**upload(archive_bytes), "name": ["one", "two"]})
    assert names.status_code == 400 and names.json() == {"errors": {"name": ["2 parts named 'name': send one"]}}
    unknown = post(client, owner, {**upload(archive_bytes), "description": "tiny"})
    assert unknown.status_code == 400 and unknown.json() == {"errors": {"description": [
        "'description' is not a field of a model upload; send name and archive"]}}
    assert nothing_kept(models_root)
    assert post(client, owner, upload(archive_bytes)).status_code == 201
    taken = post(client, owner, upload(archive_bytes, name="UPLOADED"))
    assert taken.status_code == 400 and list(taken.json()["errors"]) == ["name"]
    assert BaseModel.objects.count() == 1


def test_the_same_request_twice_gets_the_first_model(team, models_root, archive_bytes, secrets, client, tmp_path):
    """A retry after a timeout: the second is answered with the first's model, before it unpacks anything (unpacked,
    it was refused 'name taken' by the first's model); another archive under the same key is a 422."""
    first, second = (post(client, secrets["owner"], upload(archive_bytes), key="model-1") for _ in range(2))
    model = BaseModel.objects.get(project=team.project)
    assert first.status_code == second.status_code == 201, second.content
    assert first.json() == second.json() and second.json()["id"] == model.public_id
    assert second["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    model_files = write_model_dir(tmp_path / "other" / "tiny")
    (model_files / "README.md").write_text("another model")
    other = post(client, secrets["owner"], upload(zip_of(tmp_path / "other.zip", model_files).read_bytes()),
                 key="model-1")
    assert other.status_code == 422 and other.json() == {"errors": {"Idempotency-Key": [REUSED]}}
    assert BaseModel.objects.count() == 1
    assert [path for path in left_in(models_root) if path.count("/") == 2] == ["projects/alpha/uploaded"]


def test_a_key_too_long_is_refused_before_anything_is_unpacked(team, models_root, archive_bytes, secrets, client):
    response = post(client, secrets["owner"], upload(archive_bytes), key="k" * 201)
    assert response.status_code == 400 and response.json() == {"errors": {"Idempotency-Key": [
        "Idempotency-Key is 201 characters long; it may be at most 200"]}}
    assert left_in(models_root) == [] and not BaseModel.objects.exists()


def test_the_openapi_document_describes_the_upload(db, client):
    operation = client.get("/api/v1/openapi.json").json()["paths"]["/api/v1/projects/{slug}/base-models/"]["post"]
    form = operation["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert set(form["properties"]) == {"name", "archive"} and set(form["required"]) == {"name", "archive"}
    assert form["properties"]["archive"]["format"] == "binary"
    responses = operation["responses"]
    assert responses["201"]["content"]["application/json"]["schema"]["$ref"].endswith("/BaseModelOut")
    assert {"400", "403", "404", "413", "422"} <= set(responses)
    assert "Idempotency-Key" in [parameter["name"] for parameter in operation["parameters"]]


@pytest.mark.django_db(transaction=True)  # the guard reads the token in a thread of its own
def test_the_asgi_guard_takes_a_model_sized_body_from_an_owners_token_only():
    team = make_team()
    headers = {role: [(b"authorization", f"Bearer {token_create(user=getattr(team, role), name='g')[1]}".encode())]
               for role in ROLES}
    assert run_the_guard(URL, headers["owner"]) == ([URL], [])
    for role, sent_headers in [*((role, headers[role]) for role in ROLES[1:]), ("anonymous", [])]:
        calls, sent = run_the_guard(URL, sent_headers)
        assert calls == [] and sent[0]["status"] == 413, role
        assert (b"content-type", b"application/json") in sent[0]["headers"], role
        assert "a model archive is taken from an owner of the project" in sent[1]["body"].decode(), role
    # The datasets address keeps its own limit, under the one for models.
    calls, sent = run_the_guard("/api/v1/projects/alpha/datasets/", headers["owner"])
    assert calls == [] and "(TEMPER_MAX_UPLOAD_BYTES)" in sent[1]["body"].decode()


def readme_upload_example() -> tuple[str, list[str]]:
    """The README's REST API example of a model upload: its ``tar`` line and its ``curl`` command, split as a shell
    would split them (continued lines joined)."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = readme[readme.index("## REST API"):readme.index("## Chat")]
    lines = section.replace("\\\n", " ").splitlines()
    [tar] = [line for line in lines if line.startswith("tar -czf")]
    [curl] = [line for line in lines if line.startswith("curl") and "base-models/" in line]
    return tar.split("#")[0], shlex.split(curl)


@pytest.mark.django_db
def test_the_readme_example_uploads_a_model(models_root, tmp_path, client):
    """The README's curl command, sent field for field and header for header through the test client, with an
    archive packed as its tar line packs one (the directory in one folder at the top)."""
    team = make_team(slug="demo")
    tar, curl = readme_upload_example()
    _tar, _czf, archive_name, folder = tar.split()
    archive = tar_of(tmp_path / archive_name, write_model_dir(tmp_path / folder), prefix=folder)
    secret = token_create(user=team.owner, name="readme")[1]
    fields, headers, address = {}, {}, None
    words = iter(curl[1:])
    for word in words:
        if word == "-F":
            field, value = next(words).split("=", 1)
            fields[field] = value
        elif word == "-H":
            header, value = next(words).split(": ", 1)
            headers["HTTP_" + header.upper().replace("-", "_")] = value.replace("$TOKEN", secret)
        else:
            address = urlsplit(word).path
    assert fields["archive"] == f"@{archive.name}" and headers["HTTP_AUTHORIZATION"] == f"Bearer {secret}"

    def sent() -> dict:  # curl's -F field=@file: the file's bytes under its name
        return {field: SimpleUploadedFile(value[1:], (tmp_path / value[1:]).read_bytes()) if value.startswith("@")
                else value for field, value in fields.items()}

    answers = [client.post(address, sent(), **headers) for _ in range(2)]  # a retry under its Idempotency-Key
    model = BaseModel.objects.get(project=team.project)
    assert [answer.status_code for answer in answers] == [201, 201] and answers[1]["Idempotent-Replayed"] == "true"
    assert answers[0].json()["id"] == model.public_id and model.name == fields["name"]
    assert model.path == str(models_root.resolve() / "projects" / "demo" / fields["name"])


@pytest.mark.django_db(transaction=True)  # two requests at once, each on its own connection
def test_a_retry_sent_while_the_first_unpacks_gets_the_first_model(tmp_path, settings, monkeypatch):
    """A client that times out and retries while its first request still unpacks: the retry waits for the first and
    is answered with its model (both passed the early 'sent before?' check, and the retry was refused 'name taken')."""
    team, (root, archive) = make_team(), _archive_in(tmp_path, settings)
    owner = token_create(user=team.owner, name="script")[1]
    slowed_unpacking(monkeypatch, 1.0)
    first, second = sent_at_once(*[lambda client: post(client, owner, upload(archive), key="retried")] * 2)
    assert (first.status_code, second.status_code) == (201, 201), (first.content, second.content)
    model = BaseModel.objects.get(project=team.project)
    assert first.json()["id"] == second.json()["id"] == model.public_id
    assert sorted(answer.get("Idempotent-Replayed", "") for answer in (first, second)) == ["", "true"]
    assert [path for path in left_in(root) if path.count("/") == 2] == ["projects/alpha/uploaded"]


@pytest.mark.django_db(transaction=True)
def test_a_retry_still_waiting_when_the_wait_ends_is_told_to_try_again(tmp_path, settings, monkeypatch):
    from webapp.core import submissions

    team, (root, archive) = make_team(), _archive_in(tmp_path, settings)
    owner = token_create(user=team.owner, name="script")[1]
    slowed_unpacking(monkeypatch, 3.0)
    monkeypatch.setattr(submissions, "WAIT_FOR_FIRST_SECONDS", 0.5)

    def retried_late(client):
        time.sleep(1.0)  # the first has claimed the key and is unpacking
        return post(client, owner, upload(archive), key="slow")

    first, second = sent_at_once(lambda client: post(client, owner, upload(archive), key="slow"), retried_late)
    assert first.status_code == 201, first.content
    assert second.status_code == 409 and second.json() == {"detail": submissions.STILL_BEING_PROCESSED}
    third = post(Client(), owner, upload(archive), key="slow")  # later: the first's model
    assert third.status_code == 201 and third.json()["id"] == first.json()["id"] and third["Idempotent-Replayed"]
    assert BaseModel.objects.count() == 1
    assert [path for path in left_in(root) if path.count("/") == 2] == ["projects/alpha/uploaded"]


def _archive_in(tmp_path, settings) -> tuple[Path, bytes]:
    root = settings.MODELS_ROOT = tmp_path / "models"
    root.mkdir()
    return root, zip_of(tmp_path / "tiny.zip", write_model_dir(tmp_path / "source" / "tiny")).read_bytes()


def test_an_archive_name_holding_double_quotes_is_named_as_uploaded(team, models_root, secrets, client):
    """A client following the HTML standard (a browser, urllib3 2) sends a '"' in a file's name as %22: the refusal
    named 'my %22best%22.zip'."""
    response = post(client, secrets["owner"], upload(b"not a zip", file_name="my %22best%22.zip"))
    assert response.status_code == 400 and response.json() == {"errors": {"archive": [
        'my "best".zip: not a readable zip archive (File is not a zip file); pack it again']}}
