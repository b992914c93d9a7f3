"""The web process's own cost of an OpenAI-compatible API request, by middleware chain.

Drives Django's ASGI handler in-process (no server, no network) with requests that stop before
the serve worker: ``POST /v1/chat/completions`` for a model the project does not have (token
authentication, body validation, ``model_choice``, a JSON 404) and ``GET /v1/models`` (a sync
view). Each middleware chain gets its own handler, built from that list, and the chains take
turns round by round in one process, so that they see the same machine. Prints the process's CPU
time (every thread) and the wall time per request, for requests one at a time and for
``--concurrent`` at once.

    .venv/bin/python bench/web_overhead.py [--requests 400] [--concurrent 16]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per chain and round")
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url", default="", help="e.g. postgres://temper@127.0.0.1:5432/temper "
                        "(an empty database; default: SQLite in a temporary directory)")
    return parser.parse_args()


def setup_django(data_root: Path, database_url: str = "") -> None:
    os.environ["TEMPER_DATA"] = str(data_root)
    (data_root / "staticfiles").mkdir()
    os.environ["DJANGO_SETTINGS_MODULE"] = "webapp.settings"
    os.environ.pop("TEMPER_MODELS_ROOT", None)
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)


def api_token() -> str:
    from django.contrib.auth import get_user_model

    from webapp.chat.tokens import project_token_create
    from webapp.projects.services import project_create

    from webapp.projects.models import Project

    Project.objects.filter(slug="bench").delete()  # a database kept from an earlier run
    get_user_model().objects.filter(username="bench-owner").delete()
    owner = get_user_model().objects.create_user("bench-owner", password="unused-password")
    project = project_create(name="Bench", slug="bench", owner=owner)
    return project_token_create(user=owner, project=project, name="bench")[1]


def handler_for(middleware: list[str]):
    """An ASGI handler whose chain is ``middleware`` (read from settings when it is built)."""
    from django.conf import settings
    from django.core.handlers.asgi import ASGIHandler

    saved = settings.MIDDLEWARE
    settings.MIDDLEWARE = middleware
    try:
        return ASGIHandler()
    finally:
        settings.MIDDLEWARE = saved


async def call(app, *, method: str, path: str, token: str, body: bytes = b"") -> int:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {token}".encode()),
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    status = 0

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client never leaves: Django listens for a disconnect meanwhile

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


REQUESTS = {
    "POST /v1/chat/completions (404)": dict(
        method="POST", path="/v1/chat/completions",
        body=json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        status=404),
    "GET /v1/models": dict(method="GET", path="/v1/models", body=b"", status=200),
}


async def measure(app, token: str, request: dict, *, count: int, concurrent: int) -> tuple[float, float]:
    """CPU and wall milliseconds per request: ``count`` requests, ``concurrent`` at a time."""
    started_cpu, started_wall = time.process_time(), time.perf_counter()
    for _ in range(count // concurrent):
        statuses = await asyncio.gather(*(
            call(app, method=request["method"], path=request["path"], token=token, body=request["body"])
            for _ in range(concurrent)))
        assert set(statuses) == {request["status"]}, statuses
    done = count // concurrent * concurrent
    return ((time.process_time() - started_cpu) * 1000 / done, (time.perf_counter() - started_wall) * 1000 / done)


async def main(args: argparse.Namespace, chains: dict[str, list[str]], token: str) -> None:
    apps = {name: handler_for(middleware) for name, middleware in chains.items()}
    results: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for name, app in apps.items():  # warm-up: imports, URL resolver, first queries
        for request in REQUESTS.values():
            await measure(app, token, request, count=32, concurrent=16)
    for _ in range(args.rounds):
        for request_name, request in REQUESTS.items():
            for concurrent in (1, args.concurrent):
                for name, app in apps.items():
                    results.setdefault((request_name, name, concurrent), []).append(
                        await measure(app, token, request, count=args.requests, concurrent=concurrent))
    print(f"| request | chain | at once | CPU ms / request (median of {args.rounds}) | wall ms / request |")
    print("| --- | --- | --- | --- | --- |")
    for (request_name, name, concurrent), samples in results.items():
        cpu = statistics.median(sample[0] for sample in samples)
        wall = statistics.median(sample[1] for sample in samples)
        print(f"| {request_name} | {name} | {concurrent} | {cpu:.3f} | {wall:.3f} |")


if __name__ == "__main__":
    arguments = parse_args()
    with tempfile.TemporaryDirectory() as data:
        setup_django(Path(data), arguments.database_url)
        from django.conf import settings

        current = list(settings.MIDDLEWARE)
        chains = {"settings.MIDDLEWARE": current}
        lean = [name for name in current if not name.startswith(("django.contrib", "webapp.core.bidi", "django.middleware.csrf",
                                                                  "django.middleware.clickjacking", "whitenoise"))]
        chains["without sessions, auth, messages, CSRF, frames, bidi, WhiteNoise"] = lean
        chains["none"] = []
        asyncio.run(main(arguments, chains, api_token()))
