"""One request through an ASGI application in-process, as uvicorn hands it over (Django's ASGI handler and the
middleware in front of it), for tests of what only that path shows: the body guard, chunked and cut bodies."""
from __future__ import annotations

import asyncio


def asgi_call(app, path: str, *, method: str = "GET", headers: list[tuple[bytes, bytes]] = (),
              messages: list[dict] | None = None, client: str = "127.0.0.1"
              ) -> tuple[int, dict[bytes, bytes], bytes]:
    """``path`` asked of ``app``; ``messages``: the ``http.request`` messages the body comes in (none by default).
    Returns the status, the headers (lower-cased names) and the body of the answer."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), *headers], "client": (client, 50000), "server": ("127.0.0.1", 8000)}
    pending = list(messages or [{"type": "http.request", "body": b"", "more_body": False}])
    started: dict = {}
    body = bytearray()

    async def receive():
        if pending:
            return pending.pop(0)
        await asyncio.Event().wait()  # the client stays: Django listens for a disconnect meanwhile

    async def send(message):
        if message["type"] == "http.response.start":
            started.update(message)
        else:
            body.extend(message.get("body", b""))

    asyncio.run(app(scope, receive, send))
    return started["status"], {name.lower(): value for name, value in started["headers"]}, bytes(body)


def guard_call(path: str, *, content_length: int, headers: list[tuple[bytes, bytes]] = (),
               **limits) -> tuple[list[str], list[dict]]:
    """``path`` asked through the ASGI body guard alone (``RequestBodyLimit`` with ``limits``, in front of an
    application that only notes the call) with a body of ``content_length`` bytes declared, which the guard must not
    read: the paths the application was called with, and the messages the guard sent itself."""
    from webapp.datasets.uploads import RequestBodyLimit

    calls, sent = [], []

    async def app(scope, receive, send):
        calls.append(scope["path"])

    async def receive():
        raise AssertionError("the body must not be read")

    async def send(message):
        sent.append(message)

    guard = RequestBodyLimit(app, **limits)
    length = (b"content-length", str(content_length).encode())
    asyncio.run(guard({"type": "http", "path": path, "headers": [length, *headers]}, receive, send))
    return calls, sent
