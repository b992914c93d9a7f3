"""Transactional tests end by emptying the tables their test filled, without remaking content types and permissions.

Django's ``TransactionTestCase`` (pytest-django's ``transactional_db`` and ``live_server``, the migration tests, the
browser tests) ends each test with ``manage.py flush``: every table emptied, then the ``post_migrate`` signal, whose
handlers (django.contrib.contenttypes and django.contrib.auth) make the content types and permissions of every model
again, a few queries and inserts per app. That remaking was almost all of a flush's time: 0.17-0.24 s a test on
SQLite (the emptying itself 2-28 ms), and on PostgreSQL 0.5-0.7 s, where ``TRUNCATE`` of every table costs as much
again as the remaking (a ``DELETE`` of each of the tests' few rows: 4-32 ms); bench/RESULTS.md, "Test suite time,
session 41". No test makes, changes or deletes content types or permissions (Temper has no generic relations and no
per-object permissions), so they are left as migrate made them, and every other table is emptied with ``DELETE``, in
one transaction: Django creates foreign keys deferrable on both databases, so the order does not matter. A test
that asks for ``available_apps`` or ``serialized_rollback`` keeps Django's own flush.
"""
from __future__ import annotations

from django.db import connections, transaction
from django.test import TransactionTestCase

# The tables migrate's post_migrate handlers fill (Django's flush would empty them and have them filled again).
KEPT_TABLES = frozenset({"django_content_type", "auth_permission"})

_djangos_teardown = TransactionTestCase._fixture_teardown


def tables_to_empty(connection) -> list[str]:
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    return [table for table in tables if table not in KEPT_TABLES]


def _empty_the_tests_tables(self: TransactionTestCase) -> None:
    if self.available_apps is not None or self.serialized_rollback:
        _djangos_teardown(self)
        return
    for db_name in self._databases_names(include_mirrors=False):
        connection = connections[db_name]
        with transaction.atomic(using=db_name), connection.cursor() as cursor:
            for table in tables_to_empty(connection):
                cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")


def install() -> None:
    TransactionTestCase._fixture_teardown = _empty_the_tests_tables
