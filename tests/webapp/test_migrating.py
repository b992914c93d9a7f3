"""``migrated_back_to`` (tests/webapp/migrating.py) leaves the database as ``migrate`` made it: migrated back to the
first migration of (almost) each of Temper's apps and forward again with the executor alone, the schema (every table, column,
index and constraint, as the database itself describes them), the migrations recorded, and the content types and
permissions are those of the test database, which ``migrate`` made whole at the start of the session."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

from tests.webapp.migrating import migrated_back_to

pytestmark = pytest.mark.django_db(transaction=True)

POSTGRES_SCHEMA = {
    "columns": """SELECT table_name, column_name, ordinal_position, data_type, character_maximum_length,
                         numeric_precision, is_nullable, column_default, is_identity, identity_generation
                  FROM information_schema.columns WHERE table_schema = current_schema()""",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()",
    "constraints": """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), condeferrable,
                             condeferred
                      FROM pg_constraint WHERE connamespace = current_schema()::regnamespace""",
}


def schema() -> dict[str, list[tuple]]:
    """Every table, column, index and constraint, as the database describes them (SQLite: the statements that
    make them, as it stores them)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name != 'sqlite_sequence'")
            return {"sqlite_master": sorted(cursor.fetchall(), key=repr)}
        described = {}
        for part, query in POSTGRES_SCHEMA.items():
            cursor.execute(query)
            described[part] = sorted(cursor.fetchall(), key=repr)
        return described


def bookkeeping() -> dict[str, list[tuple]]:
    """The migrations recorded as applied, and the content types and permissions ``migrate``'s handlers made."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT app_label, model FROM django_content_type")
        content_types = sorted(cursor.fetchall())
        cursor.execute("SELECT content_type_id, codename, name FROM auth_permission")
        permissions = sorted(cursor.fetchall())
    migrations = sorted(MigrationRecorder(connection).migration_qs.values_list("app", "name"))
    return {"migrations": migrations, "content_types": content_types, "permissions": permissions}


def temper_apps_first_migrations() -> list[tuple[str, str]]:
    """The first migration of each of Temper's apps whose first migration needs no later one of another app (a
    migration plan cannot go back to one and forward to the other): everything after them runs again."""
    loader = MigrationLoader(connection)
    firsts = {node for node in loader.graph.root_nodes() if loader.get_migration(*node).__module__.startswith("webapp.")}
    roots = set(loader.graph.root_nodes())
    return sorted(node for node in firsts if set(loader.graph.forwards_plan(node)) <= roots)


def test_migrating_back_and_forward_leaves_the_schema_and_records_migrate_made():
    made_by_migrate, recorded = schema(), bookkeeping()
    firsts = temper_apps_first_migrations()
    assert ("runs", "0001_initial") in firsts and ("projects", "0001_initial") in firsts
    with migrated_back_to(*firsts):
        assert schema() != made_by_migrate  # migrated back indeed: later migrations' tables and columns are gone
        assert len(bookkeeping()["migrations"]) < len(recorded["migrations"])
    assert schema() == made_by_migrate
    assert bookkeeping() == recorded
