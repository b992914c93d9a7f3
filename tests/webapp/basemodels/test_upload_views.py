"""The base models' upload page: an owner's archive unpacked into the project's folder and registered; members,
viewers and outsiders refused before anything is written; the ASGI guard takes a model-sized body from an owner
only."""
import html
import io
import tarfile
import zipfile
import threading
import time
from collections.abc import Callable

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client

from tests.asgi_calls import guard_call
from tests.webapp.basemodels.test_uploads import left_in, zip_of
from tests.webapp.factories import form_token, make_team, write_model_dir
from webapp.basemodels.models import BaseModel
from webapp.core.submissions import ALREADY_SENT, STILL_BEING_PROCESSED, TOKEN_FIELD
from webapp.datasets.uploads import MULTIPART_OVERHEAD_BYTES

URL = "/p/alpha/models/upload/"


def post(client, archive: bytes, *, name: str = "uploaded", file_name: str = "tiny.zip"):
    return client.post(URL, {"name": name, "archive": SimpleUploadedFile(file_name, archive)})


def test_it_works(team, models_root, client_for, archive_bytes):
    owner = client_for(team.owner)
    assert 'href="/p/alpha/models/upload/"' in owner.get("/p/alpha/models/").content.decode()
    page = owner.get(URL).content.decode()
    assert 'enctype="multipart/form-data"' in page and str(models_root.resolve() / "projects" / "alpha") in page
    response = post(owner, archive_bytes)
    model = BaseModel.objects.get(project=team.project)
    assert response.status_code == 302 and response["Location"] == f"/p/alpha/models/{model.public_id}/"
    assert model.name == "uploaded" and model.registered_by == team.owner
    assert model.path == str(models_root.resolve() / "projects" / "alpha" / "uploaded")
    assert "registered it as" in owner.get(response["Location"]).content.decode()


@pytest.mark.parametrize("role", ["teammate", "viewer"])
def test_it_requires_the_owner_role(team, models_root, client_for, archive_bytes, role):
    client = client_for(getattr(team, role))
    assert client.get(URL).status_code == 403
    assert post(client, archive_bytes).status_code == 403
    assert left_in(models_root) == [] and not BaseModel.objects.exists()
    assert 'href="/p/alpha/models/upload/"' not in client.get("/p/alpha/models/").content.decode()


def test_it_requires_access(team, models_root, client_for, archive_bytes):
    outsider = client_for(team.outsider)
    assert outsider.get(URL).status_code == 404
    assert post(outsider, archive_bytes).status_code == 404
    assert left_in(models_root) == [] and not BaseModel.objects.exists()


def test_it_rejects_a_bad_archive_on_the_form_escaped(team, models_root, client_for):
    response = post(client_for(team.owner), b"<b>not a zip</b>", file_name="<i>m.zip")
    assert response.status_code == 400
    page = response.content.decode()
    assert "&lt;i&gt;m.zip: not a readable zip archive (File is not a zip file); pack it again" in page
    assert "<i>m" not in page
    assert left_in(models_root) in ([], ["projects", "projects/alpha"]) and not BaseModel.objects.exists()


def test_it_rejects_a_tar_member_whose_name_is_not_utf8_on_the_form(team, models_root, client_for, tmp_path):
    """Security review: tarfile reads a name that is not UTF-8 with surrogate escapes, and a refusal naming a path
    through it (here the folder the model was packed in, its config.json unreadable) could not be encoded into the
    page: a 500. A member whose name is not UTF-8 text is refused, named with its bytes escaped."""
    model_dir = write_model_dir(tmp_path / "source" / "tiny")
    (model_dir / "config.json").write_text("{not json")
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w", encoding="utf-8", errors="surrogateescape") as tar:
        for file in sorted(model_dir.iterdir()):
            tar.add(file, arcname=f"caf\udce9/{file.name}")  # "café" in Latin-1
    response = post(client_for(team.owner), packed.getvalue(), file_name="latin1.tar")
    assert response.status_code == 400
    assert (html.escape("latin1.tar: the member 'caf\\udce9/config.json' has a name that is not UTF-8 text (byte "
                        "0xe9); rename it and pack the model directory again") in response.content.decode())
    assert left_in(models_root) in ([], ["projects", "projects/alpha"]) and not BaseModel.objects.exists()


def test_it_rejects_a_zip_member_whose_name_is_marked_utf8_but_is_not_on_the_form(team, models_root, client_for,
                                                                                   tmp_path):
    """Security review: zipfile decodes a name whose UTF-8 flag is set strictly, and the UnicodeDecodeError, not
    among the archive errors unpacking names, was a 500."""
    model_dir = write_model_dir(tmp_path / "source" / "tiny")
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        for file in sorted(model_dir.iterdir()):
            archive.writestr(f"caf\u00e9/{file.name}", file.read_bytes())  # flagged UTF-8
    damaged = packed.getvalue().replace("caf\u00e9".encode(), b"caf\xe9\xe9")  # Latin-1 under the flag
    response = post(client_for(team.owner), damaged, file_name="flagged.zip")
    assert response.status_code == 400
    assert (html.escape("flagged.zip: a member's name is marked as UTF-8 but is not (byte 0xe9); rename it and "
                        "pack the model directory again") in response.content.decode())
    assert left_in(models_root) in ([], ["projects", "projects/alpha"]) and not BaseModel.objects.exists()


def test_it_rejects_an_archive_over_the_limit_as_it_arrives(team, models_root, client_for, archive_bytes, settings):
    settings.TEMPER_MODEL_UPLOAD_MAX_BYTES = len(archive_bytes) - 1
    response = post(client_for(team.owner), archive_bytes)
    assert response.status_code == 413
    assert "model upload limit (TEMPER_MODEL_UPLOAD_MAX_BYTES)" in response.content.decode()
    assert left_in(models_root) == [] and not BaseModel.objects.exists()


def run_the_guard(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[list[str], list[dict]]:
    """``path`` asked through the ASGI guard (1 GB for datasets, 2 GB for models, 10 bytes elsewhere) with a
    1.5 GB Content-Length: the paths the application was called with, and what the guard sent itself."""
    return guard_call(path, content_length=15 * 10**8, headers=headers, max_upload_bytes=10**9, max_other_bytes=10,
                      max_model_upload_bytes=2 * 10**9)


@pytest.mark.django_db(transaction=True)  # the guard reads the session in a thread of its own
def test_the_asgi_guard_takes_a_model_sized_body_from_an_owner_only():
    team = make_team()
    sessions = {}
    for role in ("owner", "teammate", "viewer", "outsider"):
        client = Client()
        client.force_login(getattr(team, role))
        sessions[role] = [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]
    assert run_the_guard(URL, sessions["owner"]) == ([URL], [])
    for role in ("teammate", "viewer", "outsider"):
        calls, sent = run_the_guard(URL, sessions[role])
        assert calls == [] and sent[0]["status"] == 413, role
        assert "a model archive is taken from an owner of the project (signed in, or" in sent[1]["body"].decode()
    # A dataset upload keeps its own limit, under the one for models.
    calls, sent = run_the_guard("/p/alpha/datasets/new/", sessions["owner"])
    assert calls == [] and "(TEMPER_MAX_UPLOAD_BYTES)" in sent[1]["body"].decode()


def test_it_rejects_several_files_sent_as_the_archive(team, models_root, client_for, archive_bytes):
    """Django kept the last of them and dropped the others without a word."""
    response = client_for(team.owner).post(URL, {"name": "uploaded", "archive": [
        SimpleUploadedFile("a.zip", archive_bytes), SimpleUploadedFile("b.zip", archive_bytes)]})
    assert response.status_code == 400
    assert ("2 files were sent: send the model as one archive (.zip, .tar or .tar.gz of its directory)"
            in response.content.decode())
    assert left_in(models_root) == [] and not BaseModel.objects.exists()


def test_it_rejects_a_body_whose_length_alone_is_over_the_limit(team, models_root, client_for, settings):
    settings.TEMPER_MODEL_UPLOAD_MAX_BYTES = 10
    response = post(client_for(team.owner), b"x" * (MULTIPART_OVERHEAD_BYTES + 100))
    assert response.status_code == 413
    assert ("the archive is over the 10\xa0bytes model upload limit (TEMPER_MODEL_UPLOAD_MAX_BYTES); ask an "
            "administrator to raise it, or to copy the model under the models root") in response.content.decode()
    assert left_in(models_root) == [] and not BaseModel.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_it_unpacks_outside_any_transaction(models_root, archive_bytes, monkeypatch):
    """The unpacking ran inside form_send_once's transaction: on SQLite, which takes its write lock when a
    transaction begins, every other write in Temper waited (or failed, 'database is locked') for the minutes a
    large archive takes. The real unpacking runs; the test only notes whether a transaction was open around it."""
    from django.db import connection

    from webapp.basemodels import uploads

    team, in_transaction = make_team(), []
    unpack = uploads.unpack_archive

    def noting(*args, **kwargs):
        in_transaction.append(connection.in_atomic_block)
        return unpack(*args, **kwargs)

    monkeypatch.setattr(uploads, "unpack_archive", noting)
    client = Client()
    client.force_login(team.owner)
    page = client.get(URL).content.decode()
    token = page.split('name="submission_token" value="', 1)[1].split('"', 1)[0]
    response = client.post(URL, {"name": "uploaded", "submission_token": token,
                                 "archive": SimpleUploadedFile("tiny.zip", archive_bytes)})
    assert response.status_code == 302 and in_transaction == [False]
    assert BaseModel.objects.get(project=team.project).name == "uploaded"


def test_a_refused_sending_keeps_no_unpacked_folder(team, models_root, client_for, archive_bytes):
    """Unpacked before form_send_once, the folder goes when the sending is refused before the registration."""
    response = client_for(team.owner).post(URL, {"name": "uploaded", "submission_token": "x" * 201,
                                                 "archive": SimpleUploadedFile("tiny.zip", archive_bytes)})
    assert response.status_code == 400 and "submission_token is 201 characters long" in response.content.decode()
    assert left_in(models_root) in ([], ["projects", "projects/alpha"]) and not BaseModel.objects.exists()


def test_the_same_sending_twice_gets_what_the_first_made(team, models_root, client_for, archive_bytes, monkeypatch):
    """Back and send again, a proxy's retry: the second sending is told what the first made (the model's page), as
    every form is, and unpacks nothing; it was refused with 'name taken' by the first's model."""
    from webapp.basemodels import uploads

    unpacked, unpack = [], uploads.unpack_archive

    def noting(*args, **kwargs):
        unpacked.append(kwargs["archive_name"])
        return unpack(*args, **kwargs)

    monkeypatch.setattr(uploads, "unpack_archive", noting)
    owner = client_for(team.owner)
    token = form_token(owner.get(URL).content.decode())
    first, second = (owner.post(URL, {"name": "uploaded", TOKEN_FIELD: token,
                                      "archive": SimpleUploadedFile("tiny.zip", archive_bytes)}) for _ in range(2))
    model = BaseModel.objects.get(project=team.project)
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"] == f"/p/alpha/models/{model.public_id}/"
    assert ALREADY_SENT in html.unescape(owner.get(second["Location"]).content.decode())
    assert unpacked == ["tiny.zip"]


def test_another_archive_sent_with_the_same_token_is_another_sending(team, models_root, client_for, archive_bytes,
                                                                     tmp_path):
    owner = client_for(team.owner)
    token = form_token(owner.get(URL).content.decode())
    model_files = write_model_dir(tmp_path / "other" / "tiny")
    (model_files / "README.md").write_text("another model")
    other_bytes = zip_of(tmp_path / "other.zip", model_files).read_bytes()
    first, second = (owner.post(URL, {"name": "uploaded", TOKEN_FIELD: token,
                                      "archive": SimpleUploadedFile("tiny.zip", archive)})
                     for archive in (archive_bytes, other_bytes))
    assert first.status_code == 302 and second.status_code == 400
    assert "already has a base model named &#x27;uploaded&#x27;" in second.content.decode()
    assert BaseModel.objects.filter(project=team.project).count() == 1


def slowed_unpacking(monkeypatch, seconds: float) -> None:
    """The real unpacking, started ``seconds`` late: a first sending still unpacking when a retry of it arrives."""
    from webapp.basemodels import uploads

    unpack = uploads.unpack_archive

    def slowly(*args, **kwargs):
        time.sleep(seconds)
        return unpack(*args, **kwargs)

    monkeypatch.setattr(uploads, "unpack_archive", slowly)


def sent_at_once(*requests: Callable[[Client], object]) -> list:
    """Each of ``requests`` made by a client of its own in a thread of its own, all at once; their answers."""
    answers, barrier = [None] * len(requests), threading.Barrier(len(requests))

    def send(index: int) -> None:
        barrier.wait()
        try:
            answers[index] = requests[index](Client())
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(index,)) for index in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers



def owner_sending(team, token: str, archive: bytes, *, late: float = 0.0) -> Callable[[Client], object]:
    """The owner's sending of the Upload page's form under ``token``, ``late`` seconds after the others."""
    def send(client: Client):
        client.force_login(team.owner)
        time.sleep(late)
        return client.post(URL, {"name": "uploaded", TOKEN_FIELD: token,
                                 "archive": SimpleUploadedFile("tiny.zip", archive)})
    return send


@pytest.mark.django_db(transaction=True)  # two requests at once, each on its own connection
def test_a_double_click_sent_at_once_makes_one_model(models_root, archive_bytes, monkeypatch):
    """Two sendings of the form at the same moment, the first still unpacking when the second arrives: the second
    waits and lands on the first's model (it was refused 'name taken', having found no record of the first)."""
    team = make_team()
    slowed_unpacking(monkeypatch, 1.0)
    first, second = sent_at_once(*[owner_sending(team, "double-click", archive_bytes)] * 2)
    model = BaseModel.objects.get(project=team.project)
    assert (first.status_code, second.status_code) == (302, 302), (first.content, second.content)
    assert first["Location"] == second["Location"] == f"/p/alpha/models/{model.public_id}/"
    assert [path for path in left_in(models_root) if path.count("/") == 2] == ["projects/alpha/uploaded"]


@pytest.mark.django_db(transaction=True)
def test_a_sending_whose_twin_is_still_unpacking_is_told_to_try_again(models_root, archive_bytes, monkeypatch):
    from webapp.core import submissions

    team = make_team()
    slowed_unpacking(monkeypatch, 3.0)
    monkeypatch.setattr(submissions, "WAIT_FOR_FIRST_SECONDS", 0.5)
    first, second = sent_at_once(owner_sending(team, "slow", archive_bytes),
                                 owner_sending(team, "slow", archive_bytes, late=1.0))
    assert first.status_code == 302 and second.status_code == 400
    assert STILL_BEING_PROCESSED in html.unescape(second.content.decode())
    assert BaseModel.objects.count() == 1


def test_an_archive_name_holding_double_quotes_is_named_as_uploaded(team, models_root, client_for, archive_bytes):
    """A browser sends a '"' in a file's name as %22 (the HTML standard's escape in multipart's filename="..."), as
    for datasets (``datasets.uploads.name_as_uploaded``): the page's message named 'my %22best%22 model.zip'."""
    owner = client_for(team.owner)
    refused = post(owner, b"not a zip", file_name="my %22best%22 model.zip").content.decode()
    assert "my &quot;best&quot; model.zip: not a readable zip archive" in refused and "%22" not in refused
    response = post(owner, archive_bytes, file_name="my %22best%22 model.zip")
    page = owner.get(response["Location"]).content.decode()
    assert "Unpacked \u2068my &quot;best&quot; model.zip\u2069 into" in page and "%22" not in page
