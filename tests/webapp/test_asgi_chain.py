"""The middleware chain as uvicorn runs it (Django's ASGI handler, in-process): static files, pages and
API addresses answered as before, and no middleware that makes every request cross to a thread and back."""
from __future__ import annotations

import asyncio
import ipaddress

import pytest
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.utils.module_loading import import_string

from webapp.core.metrics import REQUEST_DURATION
from webapp.datasets.uploads import RequestBodyLimit


def test_every_middleware_runs_in_the_event_loop():
    """A sync-only middleware under ASGI runs in a thread, and the chain behind it back in the event loop,
    for every request (WhiteNoise's was, for API calls and token streams too)."""
    sync_only = [path for path in settings.MIDDLEWARE if not getattr(import_string(path), "async_capable", False)]
    assert sync_only == []


def call(app, path: str, *, method: str = "GET", headers: list[tuple[bytes, bytes]] = (),
         client: str = "127.0.0.1") -> tuple[int, dict[bytes, bytes], bytes]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), *headers], "client": (client, 50000), "server": ("127.0.0.1", 8000)}
    request = [{"type": "http.request", "body": b"", "more_body": False}]
    started: dict = {}
    body = bytearray()

    async def receive():
        if request:
            return request.pop()
        await asyncio.Event().wait()  # the client stays: Django listens for a disconnect meanwhile

    async def send(message):
        if message["type"] == "http.response.start":
            started.update(message)
        else:
            body.extend(message.get("body", b""))

    asyncio.run(app(scope, receive, send))
    return started["status"], {name.lower(): value for name, value in started["headers"]}, bytes(body)


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
