"""Uploads and a full disk: a dataset file or a model archive larger than the room left on the server's disk is
refused before its body is written (the views, and the ASGI guard in front of them for a sender who may upload), and a
write that fails for want of room (ENOSPC) as the file streams in, is stored or is unpacked leaves nothing behind and
says "the server's disk is full (N free)" instead of a 500. A full disk cannot be made for a test: the free space is
``fake_disk``'s, and ENOSPC is raised from the file's write."""
from __future__ import annotations

import asyncio
import errno
import json
import os
import pathlib
import shutil
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile, TemporaryUploadedFile
from django.test import Client

from tests.asgi_calls import guard_call
from tests.webapp.basemodels.test_uploads import left_in
from tests.webapp.factories import make_team
from webapp.api.services import token_create
from webapp.basemodels.models import BaseModel
from webapp.core.disk_free import UPLOAD_MARGIN_BYTES
from webapp.datasets import uploads
from webapp.datasets.models import Dataset, DatasetVersion
from webapp.datasets.uploads import RequestBodyLimit

ROWS = b'{"prompt": "Say hi", "completion": "Hi"}\n' * 50
MB = 1024**2


@pytest.fixture(autouse=True)
def data_root(settings, tmp_path):
    """A data directory of each test's own: what one stores is not another's leftover."""
    settings.DATA_ROOT = (tmp_path / "data").resolve()
    settings.DATA_ROOT.mkdir()


def dataset_form(content: bytes = ROWS) -> dict:
    return {"name": "chats", "kind": "sft", "file_format": "", "file": SimpleUploadedFile("rows.jsonl", content)}


def nothing_stored(settings) -> bool:
    stored = [path for path in Path(settings.DATA_ROOT, "datasets").rglob("*") if path.is_file()]
    return stored == [] and not Dataset.objects.exists() and not DatasetVersion.objects.exists()


def full() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_dataset_larger_than_the_room_left_is_refused_before_it_is_read(team, client_for, settings, fake_disk,
                                                                          monkeypatch):
    written = []
    monkeypatch.setattr(uploads.LimitedUploadHandler, "receive_data_chunk",
                        lambda self, raw, start: written.append(raw))
    # 2 × 400 MB (the ASGI handler's spool and the parsed file, on one disk here) + the margin: more than 1 GB.
    fake_disk.free = 1000 * MB
    response = client_for(team.teammate).post("/p/alpha/datasets/new/", dataset_form(), CONTENT_LENGTH=str(400 * MB))
    assert response.status_code == 507
    page = response.content.decode()
    assert ("the upload (400.0\xa0MB) needs about 800.0\xa0MB on the server&#x27;s disk as it is received and stored, "
            "more than the room left there (1000.0\xa0MB free, of which 256.0\xa0MB is kept for the runs and the "
            "database); nothing was saved") in page
    assert written == [] and nothing_stored(settings)
    # With room for it, it is read.
    fake_disk.free = UPLOAD_MARGIN_BYTES + MB
    client_for(team.teammate).post("/p/alpha/datasets/new/", dataset_form())
    assert written


def test_a_model_archive_larger_than_the_room_left_is_refused_by_the_api(team, models_root, archive_bytes, fake_disk):
    secret = token_create(user=team.owner, name="script")[1]
    fake_disk.free = 3 * 100 * MB + UPLOAD_MARGIN_BYTES - 1  # spooled, parsed and unpacked: 3 × 100 MB
    response = Client().post("/api/v1/projects/alpha/base-models/",
                             {"name": "tiny", "archive": SimpleUploadedFile("tiny.zip", archive_bytes)},
                             HTTP_AUTHORIZATION=f"Bearer {secret}", CONTENT_LENGTH=str(100 * MB))
    assert response.status_code == 507
    assert response.json()["detail"].startswith("the upload (100.0\xa0MB) needs about 300.0\xa0MB on the server's disk")
    assert left_in(models_root) == [] and not BaseModel.objects.exists()


@pytest.mark.django_db(transaction=True)  # the guard reads the session in a thread of its own
def test_the_asgi_guard_refuses_a_body_larger_than_the_room_left_to_a_member_only(fake_disk):
    team = make_team()
    cookies = {}
    for role in ("teammate", "outsider"):
        client = Client()
        client.force_login(getattr(team, role))
        cookies[role] = (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())
    fake_disk.free = 2 * 500 * MB + UPLOAD_MARGIN_BYTES - 1

    def guarded(cookie) -> tuple[list[str], list[dict]]:
        return guard_call("/p/alpha/datasets/new/", content_length=500 * MB, headers=[cookie],
                          max_upload_bytes=10**9, max_other_bytes=10)

    calls, sent = guarded(cookies["teammate"])
    assert calls == [] and sent[0]["status"] == 507
    assert "needs about 1000.0\xa0MB on the server&#x27;s disk" in sent[1]["body"].decode()
    calls, sent = guarded(cookies["outsider"])  # told of the size limit it may send, not of the server's disk
    assert sent[0]["status"] == 413 and "disk" not in sent[1]["body"].decode()
    fake_disk.free += 1
    assert guarded(cookies["teammate"]) == (["/p/alpha/datasets/new/"], [])


def test_a_disk_that_fills_as_a_dataset_streams_in_leaves_no_file_and_says_so(team, client_for, settings,
                                                                               monkeypatch):
    temporary = []
    real_write = TemporaryUploadedFile.write

    def write_until_full(self):
        temporary.append(self.temporary_file_path())

        def write(data):
            if self.tell() > 0:
                raise full()
            return real_write.fget(self)(data[: len(data) // 2])  # half a chunk lands: a half-written file
        return write

    monkeypatch.setattr(TemporaryUploadedFile, "write", property(write_until_full))
    monkeypatch.setattr(uploads.LimitedUploadHandler, "chunk_size", 512)  # several chunks of the 2 KB file
    response = client_for(team.teammate).post("/p/alpha/datasets/new/", dataset_form())
    assert response.status_code == 507
    page = response.content.decode()
    assert "the server&#x27;s disk is full (" in page and " free); nothing was saved" in page
    assert temporary and not any(os.path.exists(path) for path in temporary)
    assert nothing_stored(settings)


def test_a_disk_that_fills_as_a_dataset_is_stored_leaves_no_part_and_says_so(team, settings, monkeypatch):
    """The parsed file is copied, not renamed, into the data directory when that is another filesystem."""
    secret = token_create(user=team.teammate, name="script")[1]

    def copy_until_full(source, destination):
        with open(destination, "wb") as out:
            out.write(b"half of it")
        raise full()

    monkeypatch.setattr(uploads.shutil, "move", copy_until_full)
    response = Client().post("/api/v1/projects/alpha/datasets/", dataset_form(),
                             HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 400
    [message] = response.json()["errors"]["file"]
    assert message.startswith("the server's disk is full (") and " free); nothing was saved" in message
    assert nothing_stored(settings)


def test_a_disk_that_fills_as_a_model_unpacks_leaves_no_folder_and_says_so(team, models_root, archive_bytes,
                                                                           monkeypatch):
    secret = token_create(user=team.owner, name="script")[1]
    real_open = pathlib.Path.open

    class FillingFile:
        def __init__(self, out):
            self.out = out

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.out.close()

        def write(self, data):
            if self.out.tell():
                raise full()
            return self.out.write(data[:10])

    def opened(path, mode="r", *args, **kwargs):
        out = real_open(path, mode, *args, **kwargs)
        return FillingFile(out) if mode == "xb" and str(path).startswith(str(models_root)) else out

    monkeypatch.setattr(pathlib.Path, "open", opened)
    monkeypatch.setattr("webapp.basemodels.uploads.CHUNK_BYTES", 16)  # a second write to each file
    response = Client().post("/api/v1/projects/alpha/base-models/",
                             {"name": "tiny", "archive": SimpleUploadedFile("tiny.zip", archive_bytes)},
                             HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 400, response.content
    [message] = response.json()["errors"]["archive"]
    assert message.startswith("tiny.zip: the member ") and " could not be written: the server's disk is full (" in message
    assert left_in(models_root) in ([], ["projects", "projects/alpha"]) and not BaseModel.objects.exists()
    assert shutil.disk_usage(models_root)  # the real disk, untouched


@pytest.mark.django_db(transaction=True)
def test_a_disk_that_fills_as_the_server_spools_a_body_answers_507_not_a_500(monkeypatch):
    """Django's ASGI handler spools every body to a temporary file before any view runs: a full disk there raised out
    of the handler (a 500 with a traceback). The file has no name on disk; the answer says the disk is full."""
    import django.core.handlers.asgi as django_asgi

    from webapp.core.asgi_requests import MeasuredBodyASGIHandler

    class FillingSpool(django_asgi.tempfile.SpooledTemporaryFile):
        def write(self, data):
            if self.tell():
                raise full()
            return super().write(data)

    monkeypatch.setattr(django_asgi.tempfile, "SpooledTemporaryFile", FillingSpool)
    chunks = [{"type": "http.request", "body": b"x" * 1000, "more_body": True},
              {"type": "http.request", "body": b"x" * 1000, "more_body": False}]
    sent = []

    async def receive():
        return chunks.pop(0)

    async def send(message):
        sent.append(message)

    guard = RequestBodyLimit(MeasuredBodyASGIHandler(), max_upload_bytes=10**9, max_other_bytes=10**6)
    scope = {"type": "http", "method": "POST", "path": "/api/v1/projects/alpha/datasets/", "query_string": b"",
             "headers": [(b"content-length", b"2000")]}
    asyncio.run(guard(scope, receive, send))
    assert sent[0]["status"] == 507
    detail = json.loads(sent[1]["body"])["detail"]
    assert detail.startswith("the server's disk is full (") and " free); nothing was saved" in detail
