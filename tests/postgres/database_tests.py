"""A pytest plugin for the PostgreSQL rerun of ``tests/webapp`` (``test_webapp_suite_postgres.py``): only the
tests that use the database run. The others (parsers, templates, settings read in a fresh process) cannot
reach it: pytest-django refuses database access to a test that asks for none, so on PostgreSQL they would
run exactly as they did on SQLite, for time alone (a fifth of the web app's tests)."""
from __future__ import annotations

# The fixtures through which pytest-django opens the test database (a test's fixture closure holds those its
# own fixtures ask for: ``team`` asks for ``db``).
DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
                               "live_server"})


def uses_database(item) -> bool:
    return (item.get_closest_marker("django_db") is not None
            or not DATABASE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())))


def pytest_collection_modifyitems(config, items):
    kept = [item for item in items if uses_database(item)]
    left_out = [item for item in items if not uses_database(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
