"""Index operations for tables that running jobs write to.

A plain ``CREATE INDEX`` holds a SHARE lock on its table until the index is built, and no row can be
written meanwhile: on PostgreSQL, an index on the metric points (millions of rows) would hold every running
job's metric writes for minutes while a deployment migrates. ``CREATE INDEX CONCURRENTLY`` builds it under a
lock that writers pass, at two prices: it cannot run inside a transaction (its migration sets
``atomic = False``), and a build that fails (or is interrupted) leaves an INVALID index of that name behind,
which must be dropped (``DROP INDEX CONCURRENTLY <name>``) before the migration is run again. SQLite has no such
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
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)
