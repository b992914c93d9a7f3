"""The web app's own tests (``tests/webapp``), run again on PostgreSQL: ``docker compose`` deploys Temper on
it, and the default suite runs on SQLite. A first run found row locks PostgreSQL refuses (``FOR UPDATE``
on the nullable side of an outer join: resolving a review conflict and advancing a pipeline were 500s
there) and pages that showed JSON in jsonb's key order (a run's spec, a model's config.json)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.postgres.test_postgres import ROOT, database_url  # noqa: F401  (the cluster fixture)

pytestmark = pytest.mark.integration


def test_the_web_apps_tests_pass_on_postgres(database_url):  # noqa: F811
    env = {**os.environ, "DATABASE_URL": database_url}
    command = [sys.executable, "-m", "pytest", "tests/webapp", "-q", "-p", "no:cacheprovider", "-n", "0"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
