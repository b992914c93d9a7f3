"""Settings: every environment variable they read is documented in the README's configuration table, every
variable that table documents is read by some code, and a variable with a few allowed values refuses any other
at startup."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from webapp.env import env_choice

ROOT = Path(__file__).resolve().parents[2]


def readme_variables() -> set[str]:
    """The variables README's configuration table names."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("\n## Configuration (environment variables)\n", 1)[1].split("\n## ", 1)[0]
    return {name for row in table.splitlines() if row.startswith("| `")
            for name in re.findall(r"`([A-Z0-9_]+)`", row.split(" | ")[0])}


def test_the_readme_documents_every_variable_the_settings_read():
    read = set(re.findall(r'env_\w+\(\s*"([A-Z0-9_]+)"', (ROOT / "webapp" / "settings.py").read_text()))
    assert "TEMPER_DATA" in read and "DATABASE_URL" in read
    assert sorted(read - readme_variables()) == []


def test_the_readme_documents_every_variable_the_app_the_engine_and_make_up_read():
    """Not only the settings: the engine (TEMPER_DEMO_DIR), temper_setup (TEMPER_ADMIN_USER) and scripts/up.sh
    (TEMPER_HOST) read variables of their own, each in the configuration table; the test runner's and the
    multi-host compose files' (TEMPER_TEST_WORKERS, TEMPER_NFS_SERVER) are named in the README's text."""
    def read_in(paths, pattern):
        return {name for path in paths for name in re.findall(pattern, path.read_text(encoding="utf-8"))}

    python = [*(ROOT / "webapp").rglob("*.py"), *(ROOT / "worker").rglob("*.py"), *(ROOT / "jaxengine").rglob("*.py")]
    read = read_in(python, r'(?:environ(?:\.get)?\(|environ\[|getenv\(|env_\w+\()\s*"(TEMPER_[A-Z0-9_]+)"')
    read |= read_in([ROOT / "scripts" / "up.sh", ROOT / "docker-compose.yml"], r"\$\{(TEMPER_[A-Z0-9_]+)")
    assert {"TEMPER_DEMO_DIR", "TEMPER_ADMIN_USER", "TEMPER_HOST"} <= read
    assert sorted(read - readme_variables()) == []
    elsewhere = read_in([*(ROOT / "scripts").glob("*.sh"), *ROOT.glob("docker-compose*.yml")], r"\$\{(TEMPER_[A-Z0-9_]+)")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "TEMPER_NFS_SERVER" in elsewhere
    assert sorted(name for name in elsewhere if not re.search(rf"\b{name}\b", readme)) == []


def test_every_variable_the_readme_documents_is_read_somewhere():
    """The other direction: a row outliving the code that read its variable would be set to no effect."""
    places = [*(ROOT / "webapp").rglob("*.py"), *(ROOT / "worker").rglob("*.py"), *(ROOT / "jaxengine").rglob("*.py"),
              *(ROOT / "scripts").glob("*.sh")]
    code = "\n".join(path.read_text(encoding="utf-8") for path in places)
    assert sorted(name for name in readme_variables() if not re.search(rf"[\"'{{$]{name}\b", code)) == []


def test_a_choice_variable_refuses_other_values_naming_them(monkeypatch):
    monkeypatch.setenv("TEMPER_SERVE_QUANTIZE", "int16")
    with pytest.raises(ValueError, match="environment variable TEMPER_SERVE_QUANTIZE='int16' must be one of "
                                         "int8, int4, none"):
        env_choice("TEMPER_SERVE_QUANTIZE", "int8", ("int8", "int4", "none"))
    monkeypatch.setenv("TEMPER_SERVE_QUANTIZE", "")
    assert env_choice("TEMPER_SERVE_QUANTIZE", "int8", ("int8", "int4", "none")) == "int8"


def django_started(environment: dict[str, str], code: str = "import django; django.setup()"):
    """``code`` run under the production settings with nothing in its environment but ``environment``."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "", "DJANGO_SETTINGS_MODULE": "webapp.settings", **environment})


@pytest.mark.parametrize(("environment", "message"), [
    # A worker started with TEMPER_SERVE_QUANTIZE=int16 would otherwise fail every run's serving copy in its log.
    ({"TEMPER_SERVE_QUANTIZE": "int16"},
     "environment variable TEMPER_SERVE_QUANTIZE='int16' must be one of int8, int4, none"),
    # How long a worker may be silent before its tasks go to another: a wait shorter than two heartbeats would
    # hand a live worker's tasks to another between its beats, so they would run twice.
    ({"TEMPER_WORKER_STALE_AFTER": "1m"}, "environment variable TEMPER_WORKER_STALE_AFTER='1m' must be an integer"),
    ({"TEMPER_WORKER_STALE_AFTER": "0"},
     "environment variable TEMPER_WORKER_STALE_AFTER='0' is too small: give a whole number of seconds, at least 1"),
    ({"TEMPER_WORKER_STALE_AFTER": "15", "TEMPER_HEARTBEAT_SECONDS": "10"},
     "environment variable TEMPER_WORKER_STALE_AFTER=15 is shorter than two heartbeats (TEMPER_HEARTBEAT_SECONDS=10): "
     "a live worker would be taken for lost between its beats and its tasks handed to another; give at least 20 "
     "seconds, or lower TEMPER_HEARTBEAT_SECONDS"),
    ({"TEMPER_PROJECT_CREATORS": "admins"},
     "environment variable TEMPER_PROJECT_CREATORS='admins' must be one of everyone, staff"),
])
def test_the_settings_refuse_a_bad_value_at_startup_naming_it(environment, message):
    result = django_started(environment)
    assert result.returncode != 0
    assert message in result.stderr


def test_the_worker_stale_after_setting_takes_a_wait_of_two_heartbeats_or_more():
    result = django_started({"TEMPER_WORKER_STALE_AFTER": "20", "TEMPER_HEARTBEAT_SECONDS": "10"},
                            "import django; django.setup(); from webapp.workers.models import stale_after; "
                            "print(stale_after())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0:00:20"


def test_a_refused_request_is_logged_in_one_line_without_its_traceback(team, client_for, caplog):
    """Every 403 (a viewer opening a members-only page) wrote PermissionDenied's whole traceback to the
    server's log: 55 of them in one QA session."""
    import logging

    with caplog.at_level(logging.WARNING, logger="django.request"):
        assert client_for(team.viewer).get("/p/alpha/datasets/new/").status_code == 403
    [record] = [record for record in caplog.records if record.name == "django.request"]
    assert record.getMessage() == "Forbidden (Permission denied): /p/alpha/datasets/new/"
    assert record.exc_info is None and "Traceback" not in caplog.text


def run_settings(code: str, **env) -> subprocess.CompletedProcess:
    """``code`` run under the test settings with ``env`` added to this environment."""
    import os
    # No database is read; DATABASE_URL left out, so that the suite on PostgreSQL runs it alike.
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("DATABASE_URL", "TEMPER_HTTPS", "TEMPER_TRUSTED_PROXIES")}
    environment.update(DJANGO_SETTINGS_MODULE="webapp.settings_test", **env)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=120)


def test_behind_an_https_proxy_the_cookies_go_over_https_only():
    """The session and CSRF cookies had no Secure flag and nothing read the proxy's X-Forwarded-Proto, so behind
    an HTTPS proxy a session cookie was still sent over plain HTTP (and Django saw every request as HTTP). The
    header is the proxy's only when it comes from a proxy in TEMPER_TRUSTED_PROXIES, as the README's same-host
    setup lists 127.0.0.1 (the test client's address)."""
    code = """
import django; django.setup()
from django.conf import settings
from django.test import Client
for remote in ("127.0.0.1", "192.0.2.50"):
    # The login form sets the CSRF cookie.
    response = Client(HTTP_X_FORWARDED_PROTO="https", REMOTE_ADDR=remote).get("/accounts/login/")
    print(settings.SESSION_COOKIE_SECURE, bool(response.cookies["csrftoken"]["secure"]),
          response.wsgi_request.is_secure(), response.headers.get("Strict-Transport-Security"))
"""
    def run(**env) -> list[str]:
        result = run_settings(code, TEMPER_HSTS_SECONDS="3600", **env)
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    assert run(TEMPER_HTTPS="1", TEMPER_TRUSTED_PROXIES="127.0.0.1") == \
        ["True", "True", "True", "max-age=3600"] + ["True", "True", "False", "None"]  # a peer that is no proxy
    assert run(TEMPER_HTTPS="0", TEMPER_TRUSTED_PROXIES="127.0.0.1") == ["False", "False", "False", "None"] * 2


def test_https_served_by_uvicorn_itself_needs_no_proxy_and_a_plain_http_form_says_what_to_set():
    """TEMPER_HTTPS=1 with no TEMPER_TRUSTED_PROXIES stopped Temper at startup, asking for a proxy's address: but
    uvicorn serving HTTPS itself (--ssl-keyfile) hands Django requests that are HTTPS already (the ASGI scheme), and
    no proxy header is needed or believed. It starts; a request that came over HTTPS is secure, whatever a client's
    X-Forwarded-Proto says; one that came as plain HTTP, as through an HTTPS proxy not listed, has its form refused
    by a page that names the settings, and the log names the address to list."""
    code = """
import django; django.setup()
from django.test import Client
secure = Client(HTTP_X_FORWARDED_PROTO="http").get("/accounts/login/", secure=True)
print(secure.wsgi_request.is_secure(), secure.headers.get("Strict-Transport-Security"))
plain = Client(enforce_csrf_checks=True, HTTP_X_FORWARDED_PROTO="https", REMOTE_ADDR="10.1.2.3")
plain.get("/accounts/login/")
refused = plain.post("/accounts/login/", {"username": "a", "password": "b"}, HTTP_ORIGIN="https://testserver")
print(refused.status_code)
print(refused.content.decode())
"""
    result = run_settings(code, TEMPER_HTTPS="1", TEMPER_HSTS_SECONDS="3600")
    assert result.returncode == 0, result.stderr
    secure, status, page = result.stdout.split("\n", 2)
    assert (secure, status) == ("True max-age=3600", "403")
    assert ("This form could not be accepted: Temper is set to be served over HTTPS (TEMPER_HTTPS=1), but this request "
            "reached it as plain HTTP.") in page
    assert "list that proxy&#x27;s address in TEMPER_TRUSTED_PROXIES" in page and "TEMPER_HTTPS=0" in page
    assert "10.1.2.3" not in page  # a network's addresses are for its administrator: the log has it
    assert ("a form reached Temper as plain HTTP from 10.1.2.3 under TEMPER_HTTPS=1: if 10.1.2.3 is a proxy serving "
            "HTTPS, list it in TEMPER_TRUSTED_PROXIES") in result.stderr
