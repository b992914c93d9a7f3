"""The row locks of base model unregistration and serving copy requests on PostgreSQL: each locks its own
table's rows only (``FOR UPDATE OF <table>``, Django's ``select_for_update(of=("self",))``). A plain
``FOR UPDATE`` locks the rows of every table the query joins, and PostgreSQL refuses it outright on the
nullable side of an outer join; the project's convention is ``of=("self",)`` on every row lock."""
from __future__ import annotations

import pytest

from tests.postgres.test_postgres import run_django

pytestmark = pytest.mark.integration

ROW_LOCKS_SCRIPT = """
import re
import tempfile
from pathlib import Path

import django
django.setup()
from django.core.management import call_command
call_command("migrate", "--noinput", verbosity=0)
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from tests.webapp.factories import make_base_model
from webapp.basemodels import services as base_model_services
from webapp.basemodels.models import BaseModel
from webapp.celery import app as celery_app
from webapp.projects import services as project_services
from webapp.runs import serving_copies
from webapp.runs.models import Run, RunStatus, ServingCopy

assert connection.vendor == "postgresql", connection.vendor
celery_app.send_task = lambda *args, **kwargs: None  # no broker here: what is queued is not the question
owner = get_user_model().objects.create_user("owner", password="unused-password")
project = project_services.project_create(name="PG locks", slug="pg-locks", owner=owner)


def row_locks(action):
    '''The SQL of the row locks ``action()`` takes.'''
    with CaptureQueriesContext(connection) as captured:
        action()
    return [query["sql"] for query in captured.captured_queries if " FOR UPDATE" in query["sql"]]


def assert_own_rows_only(locks, *tables):
    assert [re.search(r' FOR UPDATE( OF "[a-z_]+")?', sql).group() for sql in locks] == [
        f' FOR UPDATE OF "{table}"' for table in tables], locks


output_dir = Path(tempfile.mkdtemp()) / "run"
(output_dir / "export").mkdir(parents=True)
run = Run.objects.create(project=project, name="finished", task="sft", spec={}, status=RunStatus.SUCCEEDED,
                         resolved_spec={"output_dir": str(output_dir)})
copies = []
assert_own_rows_only(
    row_locks(lambda: copies.append(serving_copies.serving_copy_request(project=project, user=owner, run=run,
                                                                         final=True))),
    "runs_run", "runs_servingcopy")
assert copies[0][1] and ServingCopy.objects.filter(run=run, step=None).exists(), copies

base_model = make_base_model(project, path=tempfile.mkdtemp())  # there: a model whose files are gone gets no copy
assert_own_rows_only(
    row_locks(lambda: serving_copies.serving_copy_request(project=project, user=owner, base_model=base_model)),
    "runs_servingcopy")
ServingCopy.objects.filter(base_model=base_model).update(status="failed")

assert_own_rows_only(
    row_locks(lambda: base_model_services.basemodel_unregister(base_model=BaseModel.objects.get(pk=base_model.pk))),
    "basemodels_basemodel")
assert not BaseModel.objects.filter(pk=base_model.pk).exists()
print("ok")
"""


NO_KEY_LOCKS_SCRIPT = """
import re

import django
django.setup()
from django.core.management import call_command
call_command("migrate", "--noinput", verbosity=0)
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from tests.webapp.factories import make_base_model
from webapp.chat.services import model_lock
from webapp.projects import services as project_services

assert connection.vendor == "postgresql", connection.vendor
owner = get_user_model().objects.create_user("no-key-owner", password="unused-password")  # the database is shared
project = project_services.project_create(name="PG no key locks", slug="pg-no-key-locks", owner=owner)
base_model = make_base_model(project)
with CaptureQueriesContext(connection) as captured, transaction.atomic():
    model_lock(project=project, ref=base_model.public_id, label="tiny", doing="as the test ran")
locks = [query["sql"] for query in captured.captured_queries if " FOR " in query["sql"]]
assert [re.search(r' FOR NO KEY UPDATE( OF "[a-z_]+")?', sql).group() for sql in locks] == [
    ' FOR NO KEY UPDATE OF "projects_project"', ' FOR NO KEY UPDATE'], locks
# The model's row is locked through exists(), whose query selects no model: Django leaves OF out there, which
# locks the same rows as long as the query joins nothing, as this one does not.
assert ' FROM "basemodels_basemodel" ' in locks[1] and " JOIN " not in locks[1], locks[1]
print("ok")
"""


def test_the_project_and_model_locks_of_work_asking_for_answers_are_no_key_locks_of_their_own_rows(
        database_url, tmp_path):
    """``select_for_update(no_key=True, of=("self",))`` (``project_lock``, ``model_lock``) as PostgreSQL takes it:
    ``FOR NO KEY UPDATE OF`` the row's own table, or of a query on that table alone."""
    assert run_django(NO_KEY_LOCKS_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"


def test_unregistering_a_base_model_and_asking_for_a_serving_copy_lock_their_own_rows_only(
        database_url, tmp_path):
    assert run_django(ROW_LOCKS_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"
