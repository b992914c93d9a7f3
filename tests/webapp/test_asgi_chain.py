"""The middleware chain as uvicorn runs it (Django's ASGI handler, in-process): static files, pages and
API addresses answered as before, and no middleware that makes every request cross to a thread and back."""
from __future__ import annotations

import asyncio

import pytest
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.utils.module_loading import import_string

from webapp.core.metrics import REQUEST_DURATION


def test_every_middleware_runs_in_the_event_loop():
    """A sync-only middleware under ASGI runs in a thread, and the chain behind it back in the event loop,
    for every request (WhiteNoise's was, for API calls and token streams too)."""
    sync_only = [path for path in settings.MIDDLEWARE if not getattr(import_string(path), "async_capable", False)]
    assert sync_only == []


def call(app, path: str, *, method: str = "GET") -> tuple[int, dict[bytes, bytes], bytes]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}
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
