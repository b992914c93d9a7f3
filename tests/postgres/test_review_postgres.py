"""Two reviewers asking at once on PostgreSQL for items with one place left: the item's row lock makes
counting its live leases and taking one a single step, so each item goes to one of them
(``webapp.review.services._lease``; SQLite: ``tests/webapp/review/test_services.py``)."""
from __future__ import annotations

import pytest

from tests.postgres.test_postgres import run_django

pytestmark = pytest.mark.integration

CONCURRENT_SCRIPT = """
import threading

import django
django.setup()
from django.core.management import call_command
call_command("migrate", "--noinput", verbosity=0)
from django.contrib.auth import get_user_model
from django.db import connection
from webapp.projects import services as project_services
from webapp.projects.models import Role
from webapp.review import services
from webapp.review.models import Item

assert connection.vendor == "postgresql", connection.vendor
users = get_user_model().objects
owner, first, second, third = (users.create_user(name, password="unused-password")
                               for name in ("owner", "first", "second", "third"))
project = project_services.project_create(name="PG", slug="pg", owner=owner)
for user in (first, second, third):
    project_services.membership_add(project=project, user=user, role=Role.MEMBER)
campaign = services.campaign_create(project=project, name="needs 2", guidelines="", required_reviews=2,
                                    reviewers=[first, second, third], source_version=None, user=owner)
ROUNDS = 20
for index in range(ROUNDS):
    item = services.item_add(campaign=campaign, prompt=f"q{index}", response_a="yes", response_b="no", source="arena")
    services.review_submit(item=item, user=third, choice="first")
served, errors, barrier = [], [], threading.Barrier(2, timeout=30)

def ask(user):
    try:
        for _ in range(ROUNDS):
            barrier.wait()
            item = services.queue_next_item(campaign=campaign, user=user)
            served.append(item.sequence if item else None)
            barrier.wait()  # both have asked before either answers
            if item is not None:
                services.review_submit(item=item, user=user, choice="first")
    except Exception as error:
        errors.append(error)
        barrier.abort()
    finally:
        connection.close()

threads = [threading.Thread(target=ask, args=(user,)) for user in (first, second)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
assert not [error for error in errors if not isinstance(error, threading.BrokenBarrierError)], errors
handed = sorted(sequence for sequence in served if sequence is not None)
assert handed == list(range(1, ROUNDS + 1)), handed
assert set(Item.objects.values_list("review_count", flat=True)) == {2}
print("ok")
"""


def test_two_reviewers_asking_at_once_for_the_last_place_get_it_once(database_url, tmp_path):
    assert run_django(CONCURRENT_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"
