"""The migration tests' one pattern: migrate back to where a migration has not run yet, make the rows it
will find with the models of then, migrate forward, and read what it made of them.

Forward is the executor's own ``migrate`` to the latest migrations, not the ``migrate`` command: the command also
renders the models of every app once more after migrating, for the ``post_migrate`` handlers, and runs them: they
make the content types and permissions of models that lack them. After a migration test every model still has them
(the test database was migrated whole, and transactional tests' teardown keeps them, tests/fast_flush.py), so those
handlers would find nothing to do. Each migration back and forward is checked to leave the schema, the migrations
recorded, the content types and the permissions as it found them (``described``, a few catalogue queries): as
``migrate`` made them at the start of the session. 23 migration tests took 105-107 s instead of 131-133 s on SQLite
(bench/RESULTS.md, "Test suite time, session 41").

Back is the executor's own plan, each migration's operations run backwards from the states Django's ``migrate`` would
run them from, made once a test process (``state_before``, ``unapplying``) rather than rendered again at each call: on
PostgreSQL the 26 migration tests' calls took 57-58 s instead of 103-150 s, on SQLite 111-156 s instead of 138-234 s
on a loaded machine (bench/RESULTS.md, "Test suite time, session 42"). Forward is Django's as it is."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.apps.registry import Apps
from django.db import connection
from django.db.transaction import atomic
from django.db.migrations.exceptions import IrreversibleError
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.migration import Migration
from django.db.migrations.operations.base import Operation
from django.db.migrations.recorder import MigrationRecorder
from django.db.migrations.state import ProjectState


@contextmanager
def migrated_back_to(*targets: tuple[str, str]) -> Iterator[Apps]:
    """The database at ``targets`` (``(app, migration)`` pairs, each app at that migration) for the block,
    which gets the historical models of that state (``apps.get_model``) to make rows with; after the block,
    even one that failed, the database is migrated forward to the latest migrations, so the tests after find
    it whole (after a block that did not fail, an AssertionError says what differs if it is not as it was). Needs
    ``pytest.mark.django_db(transaction=True)``: migrations do not run inside a test's transaction."""
    found = described()
    executor = MigrationExecutor(connection)
    migrate_back(executor, list(targets))
    try:
        yield executor.loader.project_state(list(targets)).apps
    finally:
        migrate_to_latest()
    left = described()
    differences = {part: {"before": sorted(set(found[part]) - set(left[part]), key=repr),
                          "after": sorted(set(left[part]) - set(found[part]), key=repr)}
                   for part in found if found[part] != left[part]}
    assert not differences, f"migrated back to {targets} and forward, the database is not as it was: {differences}"


def migrate_back(executor: MigrationExecutor, targets: list[tuple[str, str]]) -> None:
    """Unapply what ``executor.migrate(targets)`` would, in its order, each from the states it would use, kept for
    the process instead of made again (``unapplying``). Those are the states with every migration applied, so from
    anywhere else (inside a block that migrated back already) Django's ``migrate`` runs."""
    loader = executor.loader
    plan = executor.migration_plan(targets)
    if not set(loader.graph.nodes) <= set(loader.applied_migrations) or not all(back for _, back in plan):
        executor.migrate(targets)
        return
    for migration, _ in plan:
        unapply(executor, migration)
    executor.check_replacements()


def unapply(executor: MigrationExecutor, migration: Migration) -> None:
    """``executor.unapply_migration(state_before(migration), migration)`` with its operations' states kept
    (``unapplying``): ``Migration.unapply``'s phase 2, the operations backwards in one schema editor, each in a
    transaction of its own where it is atomic and the migration is not, then the records of it (and of those it
    replaces) deleted."""
    with executor.connection.schema_editor(atomic=migration.atomic) as schema_editor:
        for operation, to_state, from_state in unapplying(executor, migration):
            if not schema_editor.atomic_migration and (
                    operation.atomic or (migration.atomic and operation.atomic is not False)):
                with atomic(executor.connection.alias):
                    operation.database_backwards(migration.app_label, schema_editor, from_state, to_state)
            else:
                operation.database_backwards(migration.app_label, schema_editor, from_state, to_state)
    for app_label, name in migration.replaces or ():
        executor.recorder.record_unapplied(app_label, name)
    executor.recorder.record_unapplied(migration.app_label, migration.name)


# What unapplying each migration needs, made once a test process: migration files do not change during a session.
# Django's ``migrate`` back makes it again at each call: the state before the first migration it unapplies, rendered,
# then, for each operation of every later migration (unapplied or not), those models again that the operation changes
# and those related to them; then for each migration unapplied (``Migration.unapply``'s phase 1) each operation's state
# after, rendering them again. Under cProfile, 8.6 of one test's 22.7 s; 12 of the 14 s that unapplying took in
# test_name_case_migrations.py.
_unrendered: dict[tuple[str, str], ProjectState] = {}
_unapplying: dict[tuple[str, str], list[tuple[Operation, ProjectState, ProjectState]]] = {}


def state_before(executor: MigrationExecutor, migration: Migration) -> ProjectState:
    """The state before ``migration`` as ``MigrationExecutor._migrate_all_backwards`` makes it when every migration
    is applied (those before it in the plan from an empty database, in that order), rendered. Rendered whole, it is
    never "delayed" (related models left unrendered, which RunPython forward renders again): its models are those of
    Django's, rendered from the same model states."""
    if not _unrendered:  # not rendered, an operation renders nothing: 115 migrations in a fraction of a second
        state = ProjectState(real_apps=executor.loader.unmigrated_apps)
        for each, _ in executor.migration_plan(executor.loader.graph.leaf_nodes(), clean_start=True):
            _unrendered[(each.app_label, each.name)] = state.clone()
            each.mutate_state(state, preserve=False)
    state = _unrendered[(migration.app_label, migration.name)].clone()
    state.apps  # rendered before the operations change it, as Django's is
    return state


def unapplying(executor: MigrationExecutor, migration: Migration) -> list[tuple[Operation, ProjectState, ProjectState]]:
    """``Migration.unapply``'s phase 1 from ``state_before(migration)``: its operations, last first, each with the
    states before and after it."""
    key = (migration.app_label, migration.name)
    if key not in _unapplying:
        to_run = []
        after = state_before(executor, migration)
        for operation in migration.operations:
            if not operation.reversible:
                raise IrreversibleError(f"Operation {operation} in {migration} is not reversible")
            after = after.clone()
            before = after.clone()
            operation.state_forwards(migration.app_label, after)
            to_run.insert(0, (operation, before, after))
        _unapplying[key] = to_run
    return _unapplying[key]


def migrate_to_latest() -> None:
    """Apply every migration not applied yet, as ``migrate`` does, without its signals (see the module)."""
    executor = MigrationExecutor(connection)  # a new loader: it reads which migrations are applied now
    executor.migrate(executor.loader.graph.leaf_nodes())


# A column's place among its table's columns, not its ordinal_position: PostgreSQL never reuses the position of a
# dropped column, so one removed and added again (by any migration back and forward) comes back one further on.
POSTGRES_SCHEMA = {
    "columns": """SELECT table_name, column_name,
                         ROW_NUMBER() OVER (PARTITION BY table_name ORDER BY ordinal_position), data_type,
                         character_maximum_length, numeric_precision, is_nullable, column_default, is_identity,
                         identity_generation
                  FROM information_schema.columns WHERE table_schema = current_schema()""",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()",
    "constraints": """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), condeferrable,
                             condeferred
                      FROM pg_constraint WHERE connamespace = current_schema()::regnamespace""",
}


def described() -> dict[str, list[tuple]]:
    """Every table, column, index and constraint as the database describes them (SQLite: the statements that make
    them, as it keeps them), the migrations recorded as applied, and the content types and permissions."""
    with connection.cursor() as cursor:
        parts = {}
        if connection.vendor == "sqlite":
            cursor.execute("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name != 'sqlite_sequence'")
            parts["sqlite_master"] = cursor.fetchall()
        else:
            for part, query in POSTGRES_SCHEMA.items():
                cursor.execute(query)
                parts[part] = cursor.fetchall()
        cursor.execute("SELECT app_label, model FROM django_content_type")
        parts["content_types"] = cursor.fetchall()
        cursor.execute("SELECT content_type_id, codename, name FROM auth_permission")
        parts["permissions"] = cursor.fetchall()
    parts["migrations"] = list(MigrationRecorder(connection).migration_qs.values_list("app", "name"))
    return {part: sorted(rows, key=repr) for part, rows in parts.items()}
