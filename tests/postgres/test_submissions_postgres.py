"""Two concurrent sendings of one form on PostgreSQL: the committed claim lets one do the work, its ``prepare``
(outside any transaction) included; the other waits for it and is answered with what it made
(``webapp.core.submissions``)."""
from __future__ import annotations

import pytest

from tests.postgres.test_postgres import run_django

pytestmark = pytest.mark.integration

CONCURRENT_SCRIPT = """
import threading
import time

import django
django.setup()
from django.core.management import call_command
call_command("migrate", "--noinput", verbosity=0)
from django.contrib.auth import get_user_model
from django.db import connection
from webapp.core.submissions import send_once

assert connection.vendor == "postgresql", connection.vendor
user = get_user_model().objects.create_user("pg-once", password="unused-password")
made, prepared, results, barrier = [], [], [], threading.Barrier(2)

def prepare():
    prepared.append(threading.get_ident())
    time.sleep(0.5)  # the work before the transaction: the other sending arrives meanwhile

def create():
    made.append(threading.get_ident())
    time.sleep(0.5)  # the transaction stays open while the other sending arrives
    return "/made/"

def send():
    barrier.wait()
    try:
        results.append(send_once(user=user, form="/runs/new/", token="t", fields=b"same", create=create,
                                 prepare=prepare))
    finally:
        connection.close()

threads = [threading.Thread(target=send) for _ in range(2)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
assert len(made) == 1 and len(prepared) == 1, (made, prepared)
assert sorted(result.created for result in results) == [False, True], results
assert [result.result for result in results] == ["/made/", "/made/"], results
print("ok")
"""


def test_two_concurrent_sendings_make_one_thing(database_url, tmp_path):
    assert run_django(CONCURRENT_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"
