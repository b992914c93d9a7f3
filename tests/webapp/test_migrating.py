"""``migrated_back_to`` (tests/webapp/migrating.py) checks that each migration back and forward leaves the database
as it found it: the schema, the migrations recorded, the content types and the permissions (``described``), which
``migrate`` made at the start of the session. Here the check itself: a round trip that leaves the database as it was
passes, and one whose database is left otherwise is told apart, naming what differs."""
from __future__ import annotations

import pytest
from django.db import connection

from tests.webapp.migrating import described, migrated_back_to

pytestmark = pytest.mark.django_db(transaction=True)

# The last migration of an app no other migration depends on: a cheap round trip that drops a table and makes it again.
BEFORE_PREFERENCES = ("accounts", "0001_initial")


def test_a_migration_back_and_forward_leaves_the_database_as_migrate_made_it():
    made_by_migrate = described()
    with migrated_back_to(BEFORE_PREFERENCES):
        migrated_back = described()
        assert ("accounts", "0002_preferences") not in migrated_back["migrations"]
        assert migrated_back != made_by_migrate  # the preferences' table is gone
    assert described() == made_by_migrate


def test_a_database_left_otherwise_after_the_migration_forward_is_told_apart():
    try:
        with pytest.raises(AssertionError, match=r"not as it was: .*left_behind_by_the_block"):
            with migrated_back_to(BEFORE_PREFERENCES):
                with connection.cursor() as cursor:
                    cursor.execute("CREATE TABLE left_behind_by_the_block (id integer)")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS left_behind_by_the_block")
