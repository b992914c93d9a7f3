"""Fixtures for web tests: the team (see ``tests/webapp/factories.py``) and a
``client_for(user)`` that returns a logged-in Django test client."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.test import Client

from tests.webapp.factories import Team, make_team


@pytest.fixture(autouse=True, scope="session")
def every_view_imported() -> None:
    """The URLconf, and with it every app's views and services, imported before the first test: a module that
    imports a name by value (``from webapp.runs.channels import redis_client``) first imported by a page a test
    asked for while it patched that name kept the test's stand-in for the rest of the session (a FakeRedis
    without ``pipeline`` met the deletions of tests that ran after it on the same worker)."""
    from django.urls import get_resolver

    get_resolver().url_patterns


@pytest.fixture
def team(db) -> Team:
    return make_team()


@pytest.fixture
def client_for(db):
    def build(user) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return build


@pytest.fixture
def only_this_tests_workers(db) -> None:
    """No worker rows but the test's own. The session's live Celery workers (started by browser and
    integration tests; under pytest-xdist in this very process) beat into the test database too.
    Deleted inside the test's transaction, whose write lock holds their next beats back until it ends."""
    from webapp.workers.models import Worker

    Worker.objects.all().delete()


@pytest.fixture
def models_root(settings, tmp_path) -> Path:
    """An empty models root (``MODELS_ROOT``), resolved as the app resolves it; a test file wanting models in it
    from the start defines its own."""
    root = settings.MODELS_ROOT = tmp_path / "models"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def archive_bytes(tmp_path) -> bytes:
    """A zip of a tiny model directory, as the Upload page and the REST API take one."""
    from tests.webapp.basemodels.test_uploads import zip_of
    from tests.webapp.factories import write_model_dir

    return zip_of(tmp_path / "tiny.zip", write_model_dir(tmp_path / "source" / "tiny")).read_bytes()


@pytest.fixture
def served(caplog):
    """``webapp.asgi`` served by uvicorn in a thread of this process (the test database, this test's settings), as
    ``make up`` serves it (h11, no proxy headers); its log and Temper's in ``caplog``."""
    import logging
    import socket
    import threading
    import time

    import uvicorn

    from webapp.asgi import application

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, lifespan="off",
                                           proxy_headers=False, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    with caplog.at_level(logging.INFO):
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        try:
            yield port
        finally:
            server.should_exit = True
            thread.join(timeout=10)


@dataclass
class FakeDisk:
    """What ``fake_disk``'s ``shutil.disk_usage`` answers for every path: change ``free`` as a test goes on."""
    free: int
    total: int = 100 * 1024**3


@pytest.fixture
def fake_disk(monkeypatch) -> FakeDisk:
    """A disk of ``total`` bytes with ``free`` left, as ``webapp.core.disk_free`` reads every data filesystem (its
    ``disk_usage``, stubbed there alone: a full disk cannot be made for a test). Its kept answers are forgotten before
    and after, and as ``free`` changes."""
    from webapp.core import disk_free

    disk = FakeDisk(free=100 * 1024**3)

    def usage(_path):
        return shutil._ntuple_diskusage(disk.total, disk.total - disk.free, disk.free)

    monkeypatch.setattr(disk_free, "disk_usage", usage)
    monkeypatch.setattr(disk_free, "KEPT_SECONDS", 0.0)
    disk_free.forget_kept()
    yield disk
    disk_free.forget_kept()
