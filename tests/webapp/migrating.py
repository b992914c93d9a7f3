"""The migration tests' one pattern: migrate back to where a migration has not run yet, make the rows it
will find with the models of then, migrate forward, and read what it made of them."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.apps.registry import Apps
from django.core.management import call_command
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
    executor.loader.build_graph()
    executor.migrate(list(targets))
    try:
        yield executor.loader.project_state(list(targets)).apps
    finally:
        call_command("migrate", verbosity=0)
