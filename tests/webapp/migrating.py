"""The migration tests' one pattern: migrate back to where a migration has not run yet, make the rows it
will find with the models of then, migrate forward, and read what it made of them.

Forward is the executor's own ``migrate`` to the latest migrations, not the ``migrate`` command: the command
renders the whole project state twice more (once to hand to ``pre_migrate``, once again for ``post_migrate``) and
runs the ``post_migrate`` handlers, which make the content types and permissions of models that lack them. After a
migration test every model still has them (the test database was migrated whole, and transactional tests' teardown
keeps them, tests/fast_flush.py), so those handlers would find nothing to do; the schema and the migrations recorded
are those ``migrate`` leaves (tests/webapp/test_migrating.py compares them). bench/RESULTS.md, "Test suite time,
session 41": 23 migration tests took 105-107 s instead of 131-133 s on SQLite."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor


@contextmanager
def migrated_back_to(*targets: tuple[str, str]) -> Iterator[Apps]:
    """The database at ``targets`` (``(app, migration)`` pairs, each app at that migration) for the block,
    which gets the historical models of that state (``apps.get_model``) to make rows with; after the block,
    even one that failed, the database is migrated forward to the latest migrations, so the tests after find
    it whole. Needs ``pytest.mark.django_db(transaction=True)``: migrations do not run inside a test's
    transaction."""
    executor = MigrationExecutor(connection)
    executor.migrate(list(targets))
    try:
        yield executor.loader.project_state(list(targets)).apps
    finally:
        migrate_to_latest()


def migrate_to_latest() -> None:
    """Apply every migration not applied yet, as ``migrate`` does, without its signals (see the module)."""
    executor = MigrationExecutor(connection)  # a new loader: it reads which migrations are applied now
    executor.migrate(executor.loader.graph.leaf_nodes())
