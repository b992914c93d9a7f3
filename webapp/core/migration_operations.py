"""Index operations for tables that running jobs write to.

A plain ``CREATE INDEX`` holds a SHARE lock on its table until the index is built, and no row can be
written meanwhile: on PostgreSQL, an index on the metric points (millions of rows) would hold every running
job's metric writes for minutes while a deployment migrates. ``CREATE INDEX CONCURRENTLY`` builds it under a
lock that writers pass, at two prices: it cannot run inside a transaction (its migration sets
``atomic = False``), and a build that fails (or is interrupted) leaves an INVALID index of that name behind,
which running the migration again then failed on ("relation ... already exists"). The operation drops an invalid
index of its name first (``pg_index.indisvalid``; ``DROP INDEX CONCURRENTLY``), so ``migrate`` can simply be run
again; a valid one is left alone, and the build then fails as any index already there makes it. SQLite has no such
keyword and one writer at a time anyway: there the plain operation runs. The migration state is AddIndex's,
so the autodetector sees the same models either way, and a database that applied a migration with the
plain operation before is left as it is.
"""
from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db.migrations import AddIndex


class AddIndexConcurrentlyOnPostgres(AddIndexConcurrently):
    """``AddIndexConcurrently`` on PostgreSQL (the migration must set ``atomic = False``), ``AddIndex`` on the
    other databases. Migrating back drops the index concurrently on PostgreSQL too."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            self._drop_an_invalid_index(schema_editor)
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)

    def _drop_an_invalid_index(self, schema_editor) -> None:
        """Drop the index of this operation's name when an earlier build of it failed and left it INVALID."""
        name = schema_editor.quote_name(self.index.name)
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
            found = cursor.fetchone()
        if found and found[0]:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
