"""Uploads whose body ends before their file does (a model archive, a dataset file; the REST API's and the pages'),
sent to the live server as a client sends them: told that the upload ended before the file was complete, not to
attach the file they attached; nothing saved, and no partial file left on disk."""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path

import pytest
from django.test import Client

from tests.asgi_calls import asgi_call
from tests.webapp.test_asgi_chain import multipart
from webapp.api.services import token_create
from webapp.basemodels.models import BaseModel
from webapp.datasets.models import Dataset

ROWS = b"".join(b'{"prompt": "question %d", "response": "answer"}\n' % number for number in range(200))


def posted(port: int, path: str, body: bytes, *, headers: dict[str, str]) -> tuple[int, bytes]:
    """``body`` POSTed to the live server on a socket of its own, as sent (no client library that would measure or
    finish it); the status and body of its answer."""
    head = "".join(f"{name}: {value}\r\n" for name, value in {"Host": "127.0.0.1", "Connection": "close",
                                                               **headers}.items())
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + body)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def cut_inside_the_file(fields: dict[str, str], field: str, file_name: str, content: bytes,
                        kept: int) -> tuple[bytes, str]:
    """A multipart body of ``fields`` and then the file, ending ``kept`` bytes into the file: no closing boundary."""
    body, content_type = multipart(fields, {field: (file_name, content)})
    start = body.index(content)
    return body[:start + kept], content_type.decode()


@pytest.fixture
def upload_temp_dir(settings, tmp_path) -> Path:
    """Where the uploaded files stream to (``FILE_UPLOAD_TEMP_DIR``), to be found empty afterwards."""
    folder = settings.FILE_UPLOAD_TEMP_DIR = tmp_path / "upload-temp"
    folder.mkdir()
    return folder


UPLOADS = {
    "base-model": ("/api/v1/projects/alpha/base-models/", {"name": "cut"}, "archive", "tiny.zip"),
    "dataset": ("/api/v1/projects/alpha/datasets/", {"kind": "sft", "name": "cut"}, "file", "rows.jsonl"),
}


@pytest.mark.django_db(transaction=True)  # the server's threads read the rows this test writes
@pytest.mark.parametrize("upload", UPLOADS)
def test_an_api_upload_whose_body_ends_inside_its_file_is_told_so(team, models_root, archive_bytes, upload_temp_dir,
                                                                    served, upload):
    """Issue: a body that ended inside its file (a client that stopped sending, and sent the length of what it had)
    was answered "attach the model archive ... as the multipart field 'archive'" (and "attach the dataset file"):
    Django's parser drops a file without its closing boundary, and the view found none."""
    path, fields, field, file_name = UPLOADS[upload]
    content = archive_bytes if upload == "base-model" else ROWS
    body, content_type = cut_inside_the_file(fields, field, file_name, content, kept=1000)
    _token, secret = token_create(user=team.owner, name="script")
    status, answer = posted(served, path, body, headers={"Authorization": f"Bearer {secret}",
                                                         "Content-Type": content_type,
                                                         "Content-Length": str(len(body))})
    assert status == 400, answer
    assert json.loads(answer) == {"errors": {field: [
        f"the upload ended before {file_name} was complete: 1,000 bytes of it arrived, then the request's body ended "
        "with no closing multipart boundary (the client stopped sending, or sent the length of what it had); "
        "nothing was saved: send it again"]}}
    assert not BaseModel.objects.exists() and not Dataset.objects.exists()
    assert list(models_root.rglob("*")) == [] and list(upload_temp_dir.iterdir()) == []


@pytest.mark.django_db(transaction=True)
def test_an_upload_whose_connection_is_cut_mid_body_leaves_nothing_behind(team, models_root, archive_bytes, served,
                                                                          settings, monkeypatch, tmp_path):
    """How a body cut before its Content-Length surfaces: uvicorn reports the closed connection (a disconnect, or
    the client shutting its side), Django's handler drops the request before any view runs (no one is left to
    answer), and the file it was spooling the body to is deleted. Nothing is registered or unpacked."""
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))  # where Django's handler spools a body past the size below
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 1000
    body, content_type = multipart({"name": "cut"}, {"archive": ("tiny.zip", archive_bytes)})
    _token, secret = token_create(user=team.owner, name="script")
    head = (f"POST /api/v1/projects/alpha/base-models/ HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {secret}"
            f"\r\nContent-Type: {content_type.decode()}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", served), timeout=30) as connection:
        connection.sendall(head + body[:len(body) // 2])
        deadline = time.monotonic() + 10
        while not files_open_in(spool):  # the half that came is on disk
            assert time.monotonic() < deadline, "the body was never spooled"
            time.sleep(0.05)
        connection.shutdown(socket.SHUT_WR)
        assert connection.recv(65536) == b""  # closed without an answer
    deadline = time.monotonic() + 10
    while files_open_in(spool):
        assert time.monotonic() < deadline, f"left on disk: {files_open_in(spool)}"
        time.sleep(0.05)
    assert list(spool.iterdir()) == []
    assert not BaseModel.objects.exists() and list(models_root.rglob("*")) == []


def files_open_in(folder: Path) -> list[str]:
    """The files in ``folder`` this process holds open: the body's spool is a file without a name (Linux's
    O_TMPFILE), seen only among the process's descriptors, and gone from the disk once closed."""
    held = []
    for descriptor in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(descriptor)
        except OSError:  # closed meanwhile
            continue
        if target.startswith(f"{folder}/"):
            held.append(target)
    return held


@pytest.mark.django_db(transaction=True)
def test_a_body_shorter_than_its_content_length_is_told_how_much_came(team, models_root, archive_bytes,
                                                                       upload_temp_dir):
    """An ASGI server that ends the body where the connection did (uvicorn reports a disconnect instead) hands
    Django fewer bytes than the Content-Length announced: the answer says how many of them came."""
    from webapp.asgi import application

    body, content_type = cut_inside_the_file({"name": "cut"}, "archive", "tiny.zip", archive_bytes, kept=1000)
    _token, secret = token_create(user=team.owner, name="script")
    status, _headers, answer = asgi_call(
        application, "/api/v1/projects/alpha/base-models/", method="POST",
        headers=[(b"authorization", f"Bearer {secret}".encode()), (b"content-type", content_type.encode()),
                 (b"content-length", b"50000")],
        messages=[{"type": "http.request", "body": body, "more_body": False}])
    assert status == 400, answer
    assert json.loads(answer) == {"errors": {"archive": [
        f"the upload ended before tiny.zip was complete: {len(body):,} bytes of the 50,000 the request announced "
        "arrived; nothing was saved: send it again"]}}
    assert not BaseModel.objects.exists() and list(upload_temp_dir.iterdir()) == []


PAGES = {
    "base-model": ("/p/alpha/models/upload/", {"name": "cut"}, "archive", "tiny.zip"),
    "dataset": ("/p/alpha/datasets/new/", {"kind": "sft", "name": "cut"}, "file", "rows.jsonl"),
}


@pytest.mark.parametrize("page", PAGES)
def test_an_upload_page_whose_body_ends_inside_its_file_says_so(team, models_root, archive_bytes, upload_temp_dir,
                                                                page):
    path, fields, field, file_name = PAGES[page]
    content = archive_bytes if page == "base-model" else ROWS
    body, content_type = cut_inside_the_file(fields, field, file_name, content, kept=1000)
    client = Client()
    client.force_login(team.owner)
    response = client.post(path, data=body, content_type=content_type)
    assert response.status_code == 400
    assert response.context["form"].errors[field] == [
        f"the upload ended before {file_name} was complete: 1,000 bytes of it arrived, then the request's body ended "
        "with no closing multipart boundary (the client stopped sending, or sent the length of what it had); "
        "nothing was saved: send it again"]
    assert "This field is required" not in response.content.decode()
    assert not BaseModel.objects.exists() and not Dataset.objects.exists()
    assert list(models_root.rglob("*")) == [] and list(upload_temp_dir.iterdir()) == []
