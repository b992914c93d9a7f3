"""Every row lock in the web app locks its own table's rows only: ``select_for_update(of=("self",))``.

A plain ``FOR UPDATE`` locks the rows of every table its query joins (a ``select_related``, a filter across a
relation), so a lock meant for one run also held its project or dataset against unrelated writers, and
PostgreSQL refuses it outright on the nullable side of an outer join. ``of=("self",)`` on a query that joins
nothing says the same thing, so the rule is kept everywhere rather than judged per call, where a later
``select_related`` would silently widen the lock. tests/postgres/test_row_locks_postgres.py checks the SQL.
Django leaves ``OF`` out of a query that selects no model (``exists()``, ``values_list()``): such a lock must
filter on its own table's columns only, as every one here does."""
import ast
from pathlib import Path

WEBAPP = Path(__file__).resolve().parents[2] / "webapp"


def _locks_own_rows_only(call: ast.Call) -> bool:
    return any(keyword.arg == "of" and isinstance(keyword.value, ast.Tuple)
               and [ast.literal_eval(element) for element in keyword.value.elts] == ["self"]
               for keyword in call.keywords)


def test_every_row_lock_names_its_own_table():
    wide = []
    for path in sorted(WEBAPP.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "select_for_update" and not _locks_own_rows_only(node)):
                wide.append(f"{path.relative_to(WEBAPP.parent)}:{node.lineno}")
    assert not wide, f'row locks without of=("self",): {wide}'
