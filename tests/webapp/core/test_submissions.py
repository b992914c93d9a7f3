"""The one-time form token (``webapp.core.submissions``): a repeat is answered with what the first
sending made, a changed or failed sending is not a repeat, and every form that queues work or
makes data carries a token."""
import re
import threading
import time

import pytest
from django.core.exceptions import ValidationError
from django.db import connection

from tests.webapp.factories import make_base_model
from webapp.core.models import Submission
from webapp.core.submissions import TOKEN_FIELD, send_once


def test_a_repeat_gets_what_the_first_made(team):
    made = []

    def create():
        made.append(len(made))
        return f"/made/{len(made)}/"

    first = send_once(user=team.owner, form="/f/", token="t", fields=b"a=1", create=create)
    again = send_once(user=team.owner, form="/f/", token="t", fields=b"a=1", create=create)
    assert (first.result, first.created) == ("/made/1/", True)
    assert (again.result, again.created) == ("/made/1/", False) and made == [0]
    # Another form, another token, other fields or another user: each is a first sending.
    for form, token, fields, user in (("/g/", "t", b"a=1", team.owner), ("/f/", "u", b"a=1", team.owner),
                                      ("/f/", "t", b"a=2", team.owner), ("/f/", "t", b"a=1", team.teammate)):
        assert send_once(user=user, form=form, token=token, fields=fields, create=create).created
    assert len(made) == 5


def test_a_failed_sending_leaves_no_record(team):
    def refuse():
        raise ValidationError({"name": "no"})

    with pytest.raises(ValidationError):
        send_once(user=team.owner, form="/f/", token="t", fields=b"", create=refuse)
    assert not Submission.objects.exists()
    assert send_once(user=team.owner, form="/f/", token="t", fields=b"", create=lambda: "/ok/").created


def test_without_a_token_it_makes_the_thing_every_time(team):
    assert all(send_once(user=team.owner, form="/f/", token="", fields=b"", create=lambda: "/x/").created
               for _ in range(2))
    assert not Submission.objects.exists()


@pytest.mark.parametrize("path, forms", [
    ("runs/new/", 2), ("pipelines/new/", 1), ("review/new/", 1), ("review/new/generated/", 1), ("chat/", 1),
    ("arena/", 3), ("datasets/new/", 1)])
def test_every_form_that_queues_work_carries_a_token(team, client_for, path, forms):
    make_base_model(team.project)  # the chat pages show their forms once there is a model
    page = client_for(team.owner).get(f"/p/alpha/{path}")
    assert page.status_code == 200, path
    tokens = re.findall(rf'name="{TOKEN_FIELD}" value="([^"]+)"', page.content.decode())
    assert len(tokens) == forms and len(set(tokens)) == forms, path


def test_two_concurrent_sendings_make_one_thing(transactional_db, team):
    """SQLite (the default database) takes its write lock when the transaction begins, so the
    second sending waits for the first's commit, then finds its record (PostgreSQL's unique index
    does the same: ``tests/postgres/test_submissions_postgres.py``)."""
    made, results, barrier = [], [], threading.Barrier(2)

    def create():
        made.append(threading.get_ident())
        time.sleep(0.3)  # the transaction stays open while the other sending arrives
        return "/made/"

    def send():
        barrier.wait()
        try:
            results.append(send_once(user=team.owner, form="/runs/new/", token="t", fields=b"same", create=create))
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1
    assert sorted(result.created for result in results) == [False, True]
    assert [result.result for result in results] == ["/made/", "/made/"]
