"""``migrated_back_to`` (tests/webapp/migrating.py) checks that each migration back and forward leaves the database
as it found it: the schema, the migrations recorded, the content types and the permissions (``described``), which
``migrate`` made at the start of the session. Here the check itself: a round trip that leaves the database as it was
passes, and one whose database is left otherwise is told apart, naming what differs."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.webapp.migrating import described, migrate_to_latest, migrated_back_to

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


# Unapplies migrations of two apps (datasets' and the evaluations' that depend on them), some remaking tables.
BEFORE_VISIBLE_FILENAMES = ("datasets", "0008_visible_filenames")


def test_migrating_back_from_the_sessions_states_leaves_the_database_as_djangos_migrate_back():
    """``migrated_back_to`` unapplies each migration from a state the session keeps (``state_before``) rather than
    one Django's ``migrate`` makes again: the database it leaves is the one Django's leaves (on SQLite the table
    statements, which a table remade from another state would write otherwise)."""
    with migrated_back_to(BEFORE_VISIBLE_FILENAMES):
        from_the_sessions_states = described()
    try:
        MigrationExecutor(connection).migrate([BEFORE_VISIBLE_FILENAMES])
        from_djangos = described()
    finally:
        migrate_to_latest()
    assert ("evals", "0001_initial") not in from_djangos["migrations"]
    assert from_the_sessions_states == from_djangos
