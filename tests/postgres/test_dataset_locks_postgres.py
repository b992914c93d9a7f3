"""Deleting a dataset version locks the version's row only (``select_for_update(of=("self",))``): joined to
its dataset for the names its refusals show, it locked the dataset's row too, so while a deletion checked
what reads the version, an upload of a new version of the same dataset (which takes the next number under
the dataset's lock) waited for it. SQLite takes no row locks, so only PostgreSQL shows it."""
from __future__ import annotations

import pytest

from tests.postgres.test_postgres import RACE_PREAMBLE, run_django

pytestmark = pytest.mark.integration

DELETE_LOCKS_SCRIPT = RACE_PREAMBLE + """
from django.db import transaction
from tests.webapp.factories import make_ready_version
from webapp.datasets import services as dataset_services
from webapp.datasets.models import Dataset, DatasetVersion

owner = get_user_model().objects.create_user("owner", password="unused-password")
project = project_services.project_create(name="PG", slug="pg", owner=owner)
version = make_ready_version(project, name="chats")
reached, released = threading.Event(), threading.Event()
real_readers = dataset_services.version_readers


def readers_then_wait(**kwargs):
    '''The deletion holds its locks here until the other thread has tried the dataset's row.'''
    reached.set()
    released.wait(10)
    return real_readers(**kwargs)


dataset_services.version_readers = readers_then_wait
outcome = {}


def delete():
    outcome["delete"] = outcome_of(lambda: dataset_services.dataset_version_delete(
        version=DatasetVersion.objects.get(pk=version.pk)))


def lock_dataset():
    reached.wait(10)

    def take():
        with transaction.atomic():
            return Dataset.objects.select_for_update(nowait=True).get(pk=version.dataset_id)
    outcome["dataset"] = outcome_of(take, refusal=django.db.DatabaseError)
    released.set()


run_together(delete, lock_dataset)
assert outcome["delete"] == ("made", ""), outcome
assert outcome["dataset"] == ("made", ""), outcome
assert not DatasetVersion.objects.filter(pk=version.pk).exists()
print("ok")
"""


def test_deleting_a_version_leaves_its_datasets_row_unlocked(database_url, tmp_path):
    assert run_django(DELETE_LOCKS_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"
