"""Runs on PostgreSQL: the indexes on the metric points table (migrations runs 0016 and 0017) are built
CONCURRENTLY, outside a transaction, so that a running job's metric writes go on while a deployment builds
them over millions of rows; a plain CREATE INDEX would queue them behind its SHARE lock until it ended."""
from __future__ import annotations

import pytest

from tests.postgres.test_postgres import run_django

pytestmark = pytest.mark.integration

INDEX_SCRIPT = """
import io
import os
import subprocess
import sys
import time

import django
django.setup()
import psycopg
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from webapp.celery import app
app.send_task = lambda *args, **kwargs: None
from tests.webapp.factories import make_base_model, make_ready_version, make_user
from webapp.projects.services import project_create
from webapp.runs import services

assert connection.vendor == "postgresql", connection.vendor
call_command("migrate", "--noinput", verbosity=0)
INDEXES = {"0016_metricpoint_run_wall_time": "metricpoint_run_wall_time", "0017_metricpoint_run_step": "metricpoint_run_step"}


def valid_indexes():
    with connection.cursor() as cursor:
        cursor.execute("SELECT index.relname FROM pg_index JOIN pg_class index ON index.oid = pg_index.indexrelid "
                       "JOIN pg_class tab ON tab.oid = pg_index.indrelid WHERE tab.relname = 'runs_metricpoint' "
                       "AND pg_index.indisvalid")
        return {name for name, in cursor.fetchall()}


loader = MigrationLoader(connection)
for migration_name, index_name in INDEXES.items():
    assert loader.get_migration("runs", migration_name).atomic is False, migration_name
    out = io.StringIO()
    call_command("sqlmigrate", "runs", migration_name, stdout=out)
    assert "CREATE INDEX CONCURRENTLY" in out.getvalue() and "BEGIN" not in out.getvalue(), out.getvalue()
    out = io.StringIO()
    call_command("sqlmigrate", "runs", migration_name, "--backwards", stdout=out)
    assert "DROP INDEX CONCURRENTLY" in out.getvalue(), out.getvalue()
    assert index_name in valid_indexes(), (index_name, valid_indexes())

# A running job writes points while 0016 and 0017 build their indexes. The job's first write stays open, so
# the build waits for it (a concurrent build waits for the transactions that write the table; a plain one for
# its SHARE lock, ahead of every later writer); a second write must then go through.
owner = make_user("pg-index")
project = project_create(name="PG index", slug="pg-index", owner=owner)
spec = {"task": "sft", "model": make_base_model(project).public_id,
        "data": {"train": make_ready_version(project).public_id}, "train": {"max_steps": 100}}
run = services.run_create(project=project, spec=spec, user=owner)
call_command("migrate", "runs", "0015", verbosity=0)
assert not valid_indexes() & set(INDEXES.values()), valid_indexes()
INSERT = ("INSERT INTO runs_metricpoint (run_id, step, name, value, wall_time, tokens) "
          "VALUES (%s, %s, 'loss', 1.0, 1.0, 0)")
address = os.environ["DATABASE_URL"]
open_write = psycopg.connect(address)
open_write.execute(INSERT, (run.pk, 1))
migrating = subprocess.Popen([sys.executable, "manage.py", "migrate", "runs", "0017_metricpoint_run_step"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
watcher = psycopg.connect(address, autocommit=True)
deadline = time.monotonic() + 60
while not watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE INDEX%%' "
                          "AND wait_event_type = 'Lock'").fetchone()[0]:
    assert migrating.poll() is None, migrating.stdout.read()
    assert time.monotonic() < deadline, "the index build never started"
    time.sleep(0.1)
later_write = psycopg.connect(address, autocommit=True)
later_write.execute("SET lock_timeout = '5s'")
try:
    later_write.execute(INSERT, (run.pk, 2))
    written = "written"
except psycopg.errors.LockNotAvailable as error:
    written = "waited: " + str(error)
open_write.commit()
assert migrating.wait(timeout=60) == 0, migrating.stdout.read()
assert written == "written", written
assert set(INDEXES.values()) <= valid_indexes(), valid_indexes()
print("ok")
"""


def test_the_points_indexes_are_built_while_jobs_write_points(database_url, tmp_path):
    assert run_django(INDEX_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"


INVALID_INDEX_SCRIPT = """
import os

import django
django.setup()
import psycopg
from django.core.management import call_command
from django.db import connection
from tests.webapp.factories import make_base_model, make_ready_version, make_user
from webapp.celery import app
app.send_task = lambda *args, **kwargs: None
from webapp.projects.services import project_create
from webapp.runs import services
from webapp.runs.models import MetricPoint

assert connection.vendor == "postgresql", connection.vendor
call_command("migrate", "--noinput", verbosity=0)
owner = make_user("pg-invalid")
project = project_create(name="PG invalid", slug="pg-invalid", owner=owner)
spec = {"task": "sft", "model": make_base_model(project).public_id,
        "data": {"train": make_ready_version(project).public_id}, "train": {"max_steps": 100}}
run = services.run_create(project=project, spec=spec, user=owner)
MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name=name, value=1.0, wall_time=1.0)
                                 for step in (1, 2) for name in ("loss", "eval/loss")])


def index_state(name):
    with connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid, indisunique FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        return cursor.fetchone()


for migration_name, before, index_name in (("0016_metricpoint_run_wall_time", "0015", "metricpoint_run_wall_time"),
                                           ("0017_metricpoint_run_step", "0016", "metricpoint_run_step")):
    call_command("migrate", "runs", before, verbosity=0)
    assert index_state(index_name) is None, index_name
    # A concurrent build that fails (here on the duplicate points a unique index refuses) leaves its index INVALID.
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as failing:
        try:
            failing.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {index_name} ON runs_metricpoint (run_id)")
            raise AssertionError("the unique build went through")
        except psycopg.errors.UniqueViolation:
            pass
    assert index_state(index_name) == (False, True), index_state(index_name)
    # The migration run again drops it and builds its own.
    call_command("migrate", "runs", migration_name, verbosity=0)
    assert index_state(index_name) == (True, False), (index_name, index_state(index_name))
call_command("migrate", "--noinput", verbosity=0)
print("ok")
"""


def test_a_failed_concurrent_build_leaves_an_invalid_index_that_migrating_again_replaces(database_url,
                                                                                         tmp_path):
    """A concurrent index build that fails leaves an INVALID index of its name, and running the migration again
    failed on it ('relation ... already exists'): the operator had to find and drop it by hand. The operation
    drops an invalid index of that name first, so ``migrate`` can simply be run again."""
    assert run_django(INVALID_INDEX_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"
