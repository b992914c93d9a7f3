"""Two owners demoting each other at the same moment on PostgreSQL: one change is made and the other is
refused in words, so the project keeps an owner and no one gets a server error
(``webapp.projects.services._ensure_another_owner``; SQLite's transactions take its write lock when they
begin, so there the two run one after the other)."""
from __future__ import annotations

import pytest

from tests.postgres.test_postgres import run_django

pytestmark = pytest.mark.integration

DEMOTE_EACH_OTHER_SCRIPT = """
import threading

import django
django.setup()
from django.core.management import call_command
call_command("migrate", "--noinput", verbosity=0)
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connection
from webapp.projects import services
from webapp.projects.models import Membership, Role

assert connection.vendor == "postgresql", connection.vendor
users = get_user_model().objects
first, second = (users.create_user(name, password="unused-password") for name in ("first", "second"))
project = services.project_create(name="PG", slug="pg", owner=first)
services.membership_add(project=project, user=second, role=Role.OWNER)

# Each change waits (up to a second) for the other to have checked too, so that both check before either
# writes, as two owners pressing Change at once may.
checked = threading.Barrier(2, timeout=1)
ensure_another_owner = services._ensure_another_owner

def check_then_wait(membership):
    ensure_another_owner(membership)
    try:
        checked.wait()
    except threading.BrokenBarrierError:
        pass  # the other change waits for this one's lock: it checks once this one is done

services._ensure_another_owner = check_then_wait
made, refused, failed = [], [], []

def demote(user):
    try:
        services.membership_set_role(membership=Membership.objects.get(project=project, user=user), role=Role.MEMBER)
        made.append(user.username)
    except ValidationError as error:
        refused.append(" ".join(error.messages))
    except Exception as error:
        failed.append(repr(error))
    finally:
        connection.close()

threads = [threading.Thread(target=demote, args=(user,)) for user in (first, second)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
assert not failed, failed
assert len(made) == 1 and len(refused) == 1, (made, refused)
assert "is the last owner of" in refused[0], refused
assert Membership.objects.filter(project=project, role=Role.OWNER).count() == 1
print("ok")
"""


def test_two_owners_demoting_each_other_at_once_leave_one_owner_and_no_error(database_url, tmp_path):
    assert run_django(DEMOTE_EACH_OTHER_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"
