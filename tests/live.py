"""Real processes for integration and browser tests: a Redis server and Celery workers.

Design note: the test process and the workers share one database and one data root. The test
database is a SQLite file (``webapp/settings_test.py`` names it; under PostgreSQL it is the
server's test database), created by pytest-django; workers run ``webapp.settings`` with
``DATABASE_URL`` pointing at it and ``TEMPER_DATA`` at the test data root, so a row a test
commits (``transactional_db``) is what the worker reads, and what the worker writes the test
sees. The web side of the test process sends tasks to the same Redis (``redis_url`` repoints
the Celery app's broker).

Fixtures (registered in ``tests/conftest.py``, session-scoped, started on first use):

- ``redis_url``: a ``redis-server`` on a free loopback port, no persistence;
- ``celery_workers``: ``celery_workers.ensure("default")`` starts (once per session) a worker
  consuming that queue and returns it; later suites ask for ``"train"`` or ``"serve"`` the
  same way;
- ``default_worker``: a running ``default`` worker, with ``transactional_db``.

``wait_for(condition, timeout=...)`` polls until a condition holds, failing with the worker
logs when it does not.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

ROOT = Path(__file__).resolve().parent.parent
REDIS_START_SECONDS = 10
WORKER_START_SECONDS = 90


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stop(process: subprocess.Popen, *, grace_seconds: float = 10) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=grace_seconds)


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen
    workdir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as connection:
                connection.sendall(b"PING\r\n")
                return connection.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        _stop(self.process)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def restart(self, *, down_seconds: float = 0.0) -> None:
        """Stop the server (its data is lost: no persistence), wait, and start a fresh one on the
        same port, as an operator's restart or a crash and supervisor restart would."""
        _stop(self.process)
        time.sleep(down_seconds)
        self.process = _start_redis_process(self.port, self.workdir)
        _wait_for_ping(self)


def start_redis() -> RedisServer:
    """Start ``redis-server`` on a free loopback port and wait until it answers PING."""
    executable = shutil.which("redis-server")
    if executable is None:
        pytest.fail("redis-server is not installed: run `bash scripts/ensure_redis.sh` (or .ci/run) first")
    workdir = Path(tempfile.mkdtemp(prefix="temper-test-redis-"))
    port = free_port()
    server = RedisServer(port=port, process=_start_redis_process(port, workdir), workdir=workdir)
    _wait_for_ping(server)
    return server


def _start_redis_process(port: int, workdir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )


def _wait_for_ping(server: RedisServer) -> None:
    deadline = time.monotonic() + REDIS_START_SECONDS
    while not server.ping():
        if server.process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            pytest.fail(f"redis-server did not start on port {server.port}")
        time.sleep(0.05)


def database_url_for_workers() -> str:
    """A ``DATABASE_URL`` for the test database as pytest-django set it up."""
    from django.db import connection

    database = connection.settings_dict
    if database["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{database['NAME']}"
    if database["ENGINE"] == "django.db.backends.postgresql":
        credentials = quote(database["USER"], safe="") + (
            f":{quote(database['PASSWORD'], safe='')}" if database["PASSWORD"] else "")
        return f"postgres://{credentials}@{database['HOST'] or 'localhost'}:{database['PORT'] or 5432}/{database['NAME']}"
    raise NotImplementedError(f"workers cannot share a {database['ENGINE']} test database")


def worker_environment(*, redis_url: str) -> dict[str, str]:
    """The environment of a worker process that shares this test run's database and data root."""
    from django.conf import settings

    environment = dict(os.environ)
    environment.update(
        DJANGO_SETTINGS_MODULE="webapp.settings",
        DATABASE_URL=database_url_for_workers(),
        TEMPER_DATA=str(settings.DATA_ROOT),
        TEMPER_MODELS_ROOT=str(settings.MODELS_ROOT),
        TEMPER_MAX_UPLOAD_BYTES=str(settings.TEMPER_MAX_UPLOAD_BYTES),
        REDIS_URL=redis_url,
        TEMPER_CELERY_EAGER="0",
        # No serving copy after each test run: that is tested on its own (tests/worker/test_serve.py).
        TEMPER_SERVE_QUANTIZE="none",
        # No warm-up compiles beside the tests' generations (tests/worker/test_serve.py tests them).
        TEMPER_SERVE_WARMUP="0",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    return environment


def temper_settings(environment: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in environment.items() if name.startswith("TEMPER_")}


@dataclass
class CeleryWorker:
    queue: str
    process: subprocess.Popen
    log_path: Path
    settings: dict[str, str] = field(default_factory=dict)  # the TEMPER_* environment it started with

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        _stop(self.process)


# The serve worker batches concurrent generations across task threads, as it runs in production.
POOLS = {"serve": ("--pool", "threads", "--concurrency", "4")}


def start_worker(queue: str, *, redis_url: str, log_dir: Path, name: str | None = None,
                 pool_args: tuple[str, ...] | None = None, environment: dict[str, str] | None = None) -> CeleryWorker:
    """Start ``celery -A worker.celery worker -Q <queue>`` (solo pool: one task at a time, in the
    worker process itself; serve: ``POOLS``) and wait until it reports ready. ``name`` (default
    ``test-<queue>``), ``pool_args`` and extra ``environment`` serve workers that play hosts of a
    pool; each worker leads its own process group, so that a test can kill it with its children."""
    name = name or f"test-{queue}"
    log_path = log_dir / f"worker-{name}.log"
    log_file = open(log_path, "wb")
    full_environment = {**worker_environment(redis_url=redis_url), **(environment or {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "worker.celery", "worker", "-Q", queue,
         *(pool_args or POOLS.get(queue, ("--pool", "solo"))),
         "-n", f"{name}@%h", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
         "--without-heartbeat"],
        cwd=ROOT, env=full_environment, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
    )
    log_file.close()
    worker = CeleryWorker(queue=queue, process=process, log_path=log_path, settings=temper_settings(full_environment))
    deadline = time.monotonic() + WORKER_START_SECONDS
    while " ready." not in worker.log():
        if process.poll() is not None or time.monotonic() > deadline:
            worker.stop()
            pytest.fail(f"the {queue} worker did not start; its log:\n{worker.log()[-4000:]}")
        time.sleep(0.1)
    return worker


@dataclass
class CeleryWorkers:
    """Workers of this test session, one per queue, started on first request."""

    redis_url: str
    log_dir: Path
    running: dict[str, CeleryWorker] = field(default_factory=dict)

    def ensure(self, queue: str) -> CeleryWorker:
        """The session's worker of ``queue``, started anew when it is gone or was started with other
        TEMPER_* settings than the environment has now (a module's fast run timings, say): under
        pytest-xdist a worker started by one test file may serve the next file of its process."""
        worker = self.running.get(queue)
        if worker is not None and worker.settings != temper_settings(worker_environment(redis_url=self.redis_url)):
            worker.stop()
            worker = None
        if worker is None or worker.process.poll() is not None:
            worker = self.running[queue] = start_worker(queue, redis_url=self.redis_url, log_dir=self.log_dir)
        return worker

    def logs(self) -> str:
        return "\n".join(f"--- {queue} worker ---\n{worker.log()[-4000:]}" for queue, worker in self.running.items())

    def stop_all(self) -> None:
        for worker in self.running.values():
            worker.stop()
        self.running.clear()


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` (for the worker processes started meanwhile), as they were again after."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in values.items():
            patch.setenv(name, value)
        yield


def wait_for(condition: Callable[[], Any], *, timeout: float = 30, interval: float = 0.1,
              workers: CeleryWorkers | None = None, what: str = "the condition") -> Any:
    """Poll ``condition`` until it returns something truthy, and return that; fail after ``timeout``
    seconds, with the workers' logs when given."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            logs = f"\n{workers.logs()}" if workers is not None else ""
            pytest.fail(f"timed out after {timeout} s waiting for {what}{logs}")
        time.sleep(interval)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """This session's private Redis server (``redis_url`` is its URL)."""
    server = start_redis()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server) -> Iterator[str]:
    """A private Redis for this session; the web side's Celery app sends its tasks there."""
    from webapp.celery import app as celery_app

    server = redis_server
    previous = celery_app.conf.broker_url
    _use_broker(celery_app, server.url)
    try:
        yield server.url
    finally:
        _use_broker(celery_app, previous)


def _use_broker(celery_app, url: str) -> None:
    """Send the app's tasks to ``url`` from now on. Its connection pool and the producer pool made over it
    both keep the broker they were made for, so both go, as Celery drops them after a fork: a page of a
    live-server test that sent a task before this fixture ran (the chat page's prepare hint) had left
    every later send of the session knocking at the settings' default broker."""
    celery_app.close()
    if "amqp" in celery_app.__dict__:
        celery_app.amqp._producer_pool = None
    celery_app.conf.broker_url = url


@pytest.fixture(scope="session")
def celery_workers(redis_url, django_db_setup, tmp_path_factory) -> Iterator[CeleryWorkers]:
    workers = CeleryWorkers(redis_url=redis_url, log_dir=tmp_path_factory.mktemp("worker-logs"))
    try:
        yield workers
    finally:
        workers.stop_all()


@pytest.fixture
def default_worker(celery_workers, transactional_db) -> CeleryWorkers:
    """A running ``default`` worker; data the test commits is visible to it."""
    celery_workers.ensure("default")
    return celery_workers
