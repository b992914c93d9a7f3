"""``scripts/up.sh`` (``make up``) for real: Redis, three Celery workers and uvicorn
start, the demo project and admin login work, Ctrl-C stops every process, and a
second run on the same data root is just as good.

The demo model build is skipped (``TEMPER_DEMO_MODEL=0``): it imports jax and is
covered by the temper_setup tests; everything else is the real command.
"""
from __future__ import annotations

import http.cookiejar
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADMIN_USER = "operator"
ADMIN_PASSWORD = "up-test-password-1"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (.ci/run installs it)"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def session_processes(session_id: int) -> dict[int, str]:
    """pid -> command line of every live process in session ``session_id``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        # Fields after the parenthesised command name: state ppid pgrp session ...
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == session_id and fields[0] != "Z":
            found[int(entry.name)] = cmdline
    return found


class Browser:
    """Just enough of a browser: cookies and Django's CSRF token."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def get(self, path: str) -> tuple[int, str]:
        try:
            with self.opener.open(self.base + path, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def login(self, username: str, password: str) -> str:
        _, page = self.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        data = urllib.parse.urlencode(
            {"username": username, "password": password, "csrfmiddlewaretoken": token, "next": "/"}
        ).encode()
        request = urllib.request.Request(self.base + "/accounts/login/", data=data, headers={"Referer": self.base})
        with self.opener.open(request, timeout=10) as response:
            return response.url


def wait_for(check, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def start_up(data_root: Path, port: int, redis_port: int, log: Path) -> subprocess.Popen:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"REDIS_URL", "DATABASE_URL", "TEMPER_MODELS_ROOT", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(
        TEMPER_DATA=str(data_root),
        TEMPER_PORT=str(port),
        TEMPER_REDIS_PORT=str(redis_port),
        TEMPER_ADMIN_USER=ADMIN_USER,
        TEMPER_ADMIN_PASSWORD=ADMIN_PASSWORD,
        TEMPER_DEMO_MODEL="0",
        TEMPER_HEARTBEAT_SECONDS="2",
        TEMPER_METRICS_ALLOW="192.0.2.9",
    )
    # A session of its own, as a terminal would give it, so that SIGINT can go to
    # the whole foreground group like Ctrl-C does and every child is findable. SIGINT
    # at its default too, as in a terminal: a suite started in the background (`nohup
    # make test &`) inherits it ignored, and a shell cannot trap a signal ignored when it
    # started, so up.sh would see uvicorn stop (it handles SIGINT itself) and exit 1.
    return subprocess.Popen(
        ["bash", "scripts/up.sh"], cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=_terminal_signals,
    )


def _terminal_signals() -> None:
    for number in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


def run_once(data_root: Path, log: Path, *, check_workers: bool) -> None:
    port, redis_port = free_port(), free_port()
    process = start_up(data_root, port, redis_port, log)
    base = f"http://127.0.0.1:{port}"
    browser = Browser(base)
    try:
        def healthy():
            assert process.poll() is None, f"up.sh exited early:\n{log.read_text()[-3000:]}"
            try:
                return browser.get("/healthz") == (200, '{"status": "ok"}')
            except OSError:
                return False

        wait_for(healthy, timeout=45, what="/healthz")
        status, page = browser.get("/accounts/login/")
        assert status == 200 and "Log in" in page
        # No proxy is trusted (TEMPER_TRUSTED_PROXIES): a client naming another address is still its own. uvicorn
        # believed X-Forwarded-For from the same host before Temper saw the request.
        forged = urllib.request.Request(base + "/metrics", headers={"X-Forwarded-For": "192.0.2.9"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(forged, timeout=10)
        assert refused.value.code == 403 and "(this request came from 127.0.0.1)" in refused.value.read().decode()
        assert browser.login(ADMIN_USER, ADMIN_PASSWORD) == base + "/"
        status, page = browser.get("/p/demo/")
        assert status == 200 and "Demo" in page
        if check_workers:
            # Live, and with the devices their jax probe found (this host: CPU).
            wait_for(
                lambda: browser.get("/workers/")[1].count(" × cpu") == 3, timeout=40, what="three probed workers"
            )
            _, workers_page = browser.get("/workers/")
            assert workers_page.count("badge badge-ok") == 3
            for queue in ("default", "train", "serve"):
                assert f"<code>{queue}</code>" in workers_page
        children = session_processes(process.pid)
        commands = " ".join(children.values())
        assert "redis-server" in commands and "uvicorn" in commands
        assert sum("celery" in command and " worker " in command for command in children.values()) >= 3
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        finally:
            leftovers = session_processes(process.pid)
            for pid in leftovers:
                os.kill(pid, signal.SIGKILL)
    assert process.returncode == 130, log.read_text()[-3000:]
    assert not leftovers, f"processes survived Ctrl-C: {leftovers}"


def test_make_up_starts_everything_and_ctrl_c_stops_it_twice(tmp_path):
    log = tmp_path / "up.log"
    data_root = tmp_path / "data"
    run_once(data_root, log, check_workers=True)
    run_once(data_root, log, check_workers=False)
    output = log.read_text()
    assert output.count(f"admin account created: {ADMIN_USER}") == 1
    assert output.count(f"admin account: {ADMIN_USER} / {ADMIN_PASSWORD}") == 1
    assert output.count("demo project created") == 1
    assert output.count("Temper stopped.") == 2


def test_it_refuses_a_port_in_use(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        log = tmp_path / "up.log"
        process = start_up(tmp_path / "data", port, free_port(), log)
        assert process.wait(timeout=20) == 1
    assert f"port {port} is already in use" in log.read_text()
    assert not (tmp_path / "data").exists(), "nothing is set up when the port is taken"
