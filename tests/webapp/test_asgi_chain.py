"""The middleware chain as uvicorn runs it (Django's ASGI handler, in-process): static files, pages and
API addresses answered as before, and no middleware that makes every request cross to a thread and back."""
from __future__ import annotations

import ipaddress

import pytest
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.utils.module_loading import import_string

from tests.asgi_calls import asgi_call
from webapp.core.metrics import REQUEST_DURATION
from webapp.datasets.uploads import MULTIPART_OVERHEAD_BYTES, RequestBodyLimit


def test_every_middleware_runs_in_the_event_loop():
    """A sync-only middleware under ASGI runs in a thread, and the chain behind it back in the event loop,
    for every request (WhiteNoise's was, for API calls and token streams too)."""
    sync_only = [path for path in settings.MIDDLEWARE if not getattr(import_string(path), "async_capable", False)]
    assert sync_only == []


def call(app, path: str, *, method: str = "GET", headers: list[tuple[bytes, bytes]] = (),
         client: str = "127.0.0.1") -> tuple[int, dict[bytes, bytes], bytes]:
    return asgi_call(app, path, method=method, headers=headers, client=client)


@pytest.mark.django_db(transaction=True)  # the handler's threads use their own database connections
def test_static_files_pages_and_api_addresses_through_the_asgi_handler():
    (settings.STATIC_ROOT / "asgi-check.css").write_text("body { color: teal }")
    app = ASGIHandler()  # WhiteNoise lists STATIC_ROOT's files when the chain is built

    status, headers, body = call(app, "/static/asgi-check.css")
    assert (status, body) == (200, b"body { color: teal }")
    assert headers[b"content-type"].startswith(b"text/css") and b"max-age=" in headers[b"cache-control"]
    assert call(app, "/static/asgi-check.css", method="HEAD")[2] == b""
    assert call(app, "/static/missing.css")[0] == 404

    before = REQUEST_DURATION.labels("GET", "accounts/login/", "200")._sum.get()
    status, headers, body = call(app, "/accounts/login/")
    assert status == 200 and b"<form" in body and headers[b"x-frame-options"] == b"DENY"
    assert REQUEST_DURATION.labels("GET", "accounts/login/", "200")._sum.get() > before  # timed, async

    status, _headers, body = call(app, "/api/v1/projects/alpha/runs", method="POST")
    assert status == 404 and b"it ends with a slash: /api/v1/projects/alpha/runs/" in body


SECURITY_HEADERS = (b"content-security-policy", b"x-frame-options", b"x-content-type-options", b"referrer-policy",
                    b"cross-origin-opener-policy", b"strict-transport-security")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("peer", "forwarded", "secure"), [
    ("10.0.0.2", b"http", False), ("10.0.0.2", b"https", True),
    ("192.0.2.50", b"https", False),  # no trusted proxy's X-Forwarded-Proto: not believed, here as in Django
])
def test_the_upload_guards_413_has_the_security_headers_of_djangos_answers(settings, peer, forwarded, secure):
    """The guard answers an oversize body before Django: its page had no CSP, X-Frame-Options or nosniff, so
    it could be framed, and its text sniffed as another type. It gets the headers Django's own answer gets."""
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 3600
    settings.TEMPER_TRUSTED_PROXIES = (ipaddress.ip_network("10.0.0.0/24"),)
    app = RequestBodyLimit(ASGIHandler(), max_upload_bytes=100, max_other_bytes=10)
    extra = [(b"x-forwarded-proto", forwarded)]
    status, django_headers, _body = call(app, "/accounts/login/", headers=extra, client=peer)
    assert status == 200
    status, guard_headers, body = call(app, "/accounts/login/", method="POST", client=peer,
                                       headers=[*extra, (b"content-length", b"1000000000")])
    assert status == 413 and b"over the 10 bytes" in body
    expected = {name: django_headers[name] for name in SECURITY_HEADERS if name in django_headers}
    assert {b"content-security-policy", b"x-frame-options", b"x-content-type-options"} <= set(expected)
    assert (b"strict-transport-security" in expected) == secure
    assert {name: guard_headers.get(name) for name in expected} == expected
    assert not (set(SECURITY_HEADERS) - set(expected)) & set(guard_headers)


def call_chunked(app, path: str, body: bytes, *, headers: list[tuple[bytes, bytes]], chunk_bytes: int = 4096
                 ) -> tuple[int, bytes]:
    """``path`` POSTed through ``app`` with ``Transfer-Encoding: chunked`` and no ``Content-Length`` (curl
    -H 'Transfer-Encoding: chunked', a client streaming a file it does not measure): the body in pieces."""
    pieces = [body[at:at + chunk_bytes] for at in range(0, len(body), chunk_bytes)]
    status, _headers, answer = asgi_call(
        app, path, method="POST", headers=[(b"transfer-encoding", b"chunked"), *headers],
        messages=[{"type": "http.request", "body": piece, "more_body": index < len(pieces) - 1}
                  for index, piece in enumerate(pieces)])
    return status, answer


def multipart(fields: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, bytes]:
    """A multipart/form-data body of ``fields`` and ``files`` (name: (file name, content)), and its content type."""
    boundary = b"temper-chunked-boundary"
    parts = [b'--%s\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % (boundary, name.encode(), value.encode())
             for name, value in fields.items()]
    parts += [b'--%s\r\nContent-Disposition: form-data; name="%s"; filename="%s"\r\n'
              b"Content-Type: application/octet-stream\r\n\r\n%s\r\n" % (boundary, name.encode(), file_name.encode(), content)
              for name, (file_name, content) in files.items()]
    return b"".join(parts) + b"--%s--\r\n" % boundary, b"multipart/form-data; boundary=" + boundary


@pytest.fixture
def chunked_world(settings, tmp_path):
    """An owner's token, a model archive and the models root, for uploads sent chunked."""
    from tests.webapp.basemodels.test_uploads import zip_of
    from tests.webapp.factories import make_team, write_model_dir
    from webapp.api.services import token_create

    settings.MODELS_ROOT = tmp_path / "models"
    team = make_team()
    headers = [(b"authorization", f"Bearer {token_create(user=team.owner, name='script')[1]}".encode())]
    archive = zip_of(tmp_path / "tiny.zip", write_model_dir(tmp_path / "source" / "tiny")).read_bytes()
    return team, headers, archive


@pytest.mark.django_db(transaction=True)  # the handler's threads use their own database connections
def test_a_model_archive_sent_chunked_is_uploaded(chunked_world):
    """A multipart body sent chunked reached the upload views empty (Django's parser reads CONTENT_LENGTH bytes, none
    without the header) and the client was told to attach the archive it had attached."""
    from webapp.asgi import application
    from webapp.basemodels.models import BaseModel

    team, headers, archive = chunked_world
    body, content_type = multipart({"name": "chunked"}, {"archive": ("tiny.zip", archive)})
    status, answer = call_chunked(application, "/api/v1/projects/alpha/base-models/", body,
                                  headers=[*headers, (b"content-type", content_type)])
    assert status == 201, answer
    assert BaseModel.objects.get(project=team.project).name == "chunked"


@pytest.mark.django_db(transaction=True)
def test_a_dataset_file_sent_chunked_is_uploaded(chunked_world, monkeypatch):
    from webapp.asgi import application
    from webapp.datasets import services
    from webapp.datasets.models import DatasetVersion

    checks = []
    monkeypatch.setattr(services.celery_app, "send_task", lambda name, args, queue: checks.append(name))
    team, headers, _archive = chunked_world
    rows = b"".join(b'{"prompt": "question %d", "response": "answer"}\n' % number for number in range(500))
    body, content_type = multipart({"kind": "sft", "name": "sent-chunked"}, {"file": ("rows.jsonl", rows)})
    status, answer = call_chunked(application, "/api/v1/projects/alpha/datasets/", body,
                                  headers=[*headers, (b"content-type", content_type)])
    assert status == 201, answer
    version = DatasetVersion.objects.get(dataset__project=team.project, dataset__name="sent-chunked")
    assert version.absolute_path.read_bytes() == rows and len(checks) == 1


@pytest.mark.django_db(transaction=True)
def test_an_upload_sent_chunked_is_held_to_the_same_limit(chunked_world, tmp_path):
    """Counted as it arrives by the guard in front of the handler, as webapp.asgi chains them: past the model upload
    limit, a 413 naming it, and nothing unpacked."""
    from webapp.basemodels.models import BaseModel
    from webapp.core.asgi_requests import MeasuredBodyASGIHandler

    _team, headers, archive = chunked_world
    # The limit leaves MULTIPART_OVERHEAD_BYTES for the framing: the archive is past both.
    archive += b"\0" * (MULTIPART_OVERHEAD_BYTES + 10_000)
    body, content_type = multipart({"name": "chunked"}, {"archive": ("tiny.zip", archive)})
    app = RequestBodyLimit(MeasuredBodyASGIHandler(), max_upload_bytes=10_000, max_other_bytes=100,
                           max_model_upload_bytes=10_000)
    status, answer = call_chunked(app, "/api/v1/projects/alpha/base-models/", body,
                                  headers=[*headers, (b"content-type", content_type)], chunk_bytes=64 * 1024)
    assert status == 413 and b"model upload limit" in answer and b"TEMPER_MODEL_UPLOAD_MAX_BYTES" in answer
    assert not BaseModel.objects.exists() and not (tmp_path / "models" / "projects" / "alpha" / "chunked").exists()
