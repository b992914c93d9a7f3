"""The web app's own tests (``tests/webapp``), run again on PostgreSQL: ``docker compose`` deploys Temper on
it, and the default suite runs on SQLite. A first run found row locks PostgreSQL refuses (``FOR UPDATE``
on the nullable side of an outer join: resolving a review conflict and advancing a pipeline were 500s
there) and pages that showed JSON in jsonb's key order (a run's spec, a model's config.json). Only the tests that
use the database run again (``tests/postgres/database_tests.py``)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.postgres.test_postgres import ROOT

pytestmark = pytest.mark.integration

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-p", "tests.postgres.database_tests"]


def test_the_web_apps_tests_pass_on_postgres(database_url):
    env = {**os.environ, "DATABASE_URL": database_url}
    result = subprocess.run([*PYTEST, "tests/webapp"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]


def test_the_rerun_takes_the_tests_that_use_the_database_and_leaves_the_others():
    # test_bidi holds both kinds: pages asked for by a member (``team``, ``client_for``: the database through their
    # fixtures) and pure functions; the throttle class is marked django_db.
    files = ["tests/webapp/core/test_bidi.py", "tests/webapp/core/test_numbers.py", "tests/webapp/accounts/test_views.py"]
    result = subprocess.run([*PYTEST, "--collect-only", *files], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    collected = {line.strip() for line in result.stdout.splitlines() if "::" in line}
    assert {"tests/webapp/core/test_bidi.py::test_a_page_closes_a_hostile_name_inside_its_own_text",
            "tests/webapp/core/test_bidi.py::test_a_new_name_with_a_bidi_control_is_refused",
            "tests/webapp/accounts/test_views.py::TestThrottlesCountAcrossProcesses::"
            "test_wrong_passwords_checked_by_another_process_count_here"} <= collected
    assert "tests/webapp/core/test_bidi.py::test_the_templates_hold_no_bidi_controls_of_their_own" not in collected
    assert not any(name.startswith("tests/webapp/core/test_numbers.py") for name in collected)
    assert " deselected" in result.stdout
