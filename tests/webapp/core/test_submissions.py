"""The one-time form token (``webapp.core.submissions``): a repeat is answered with what the first
sending made, a changed or failed sending is not a repeat, and every form that queues work or
makes data carries a token."""
import html
import threading
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from tests.webapp.factories import form_token, form_tokens, make_base_model, make_ready_version
from webapp.core.models import Submission
from webapp.api.models import ApiToken
from webapp.chat.models import ProjectToken
from webapp.core import submissions
from webapp.core.models import SetupStep
from webapp.core.submissions import (CLAIM_TAKEN_OVER_AFTER, KEEP_DAYS, MAX_TOKEN_CHARS, TOKEN_FIELD, SendingInProgress,
                                     secret_already_shown, send_once)
from webapp.datasets import services as dataset_services


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
    ("/p/alpha/runs/new/", 2), ("/p/alpha/pipelines/new/", 1), ("/p/alpha/review/new/", 1),
    ("/p/alpha/review/new/generated/", 1), ("/p/alpha/chat/", 2), ("/p/alpha/arena/", 3),
    ("/p/alpha/datasets/new/", 1), ("/p/alpha/models/register/", 1), ("/p/alpha/models/upload/", 1),
    ("/projects/new/", 1), ("/accounts/tokens/", 1)])
def test_every_form_that_queues_work_carries_a_token(team, client_for, path, forms):
    make_base_model(team.project)  # the chat pages show their forms once there is a model
    page = client_for(team.owner).get(path)
    assert page.status_code == 200, path
    tokens = form_tokens(page.content.decode())
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


def sent_in_threads(*sendings) -> list:
    """Each of ``sendings`` called in a thread of its own, all at once; what each returned or raised."""
    outcomes, barrier = [None] * len(sendings), threading.Barrier(len(sendings))

    def send(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = sendings[index]()
        except Exception as error:
            outcomes[index] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(index,)) for index in range(len(sendings))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_work_before_the_transaction_is_done_once_for_two_sendings_at_once(transactional_db, team):
    """``prepare`` (a model archive unpacked, outside any transaction) ran for both sendings when they came at the
    same moment: the sending is claimed, and committed, before it."""
    prepared = []

    def sending():
        return send_once(user=team.owner, form="/upload/", token="t", fields=b"same", create=lambda: "/made/",
                         prepare=lambda: (prepared.append(1), time.sleep(0.5)))

    outcomes = sent_in_threads(sending, sending)
    assert len(prepared) == 1
    assert sorted((sent.result, sent.created) for sent in outcomes) == [("/made/", False), ("/made/", True)]


def test_a_sending_waiting_on_one_that_fails_is_tried_again(transactional_db, team):
    made = []

    def refused():
        time.sleep(0.5)
        raise ValidationError({"name": "taken"})

    def sending(create, late=0.0):
        time.sleep(late)
        return send_once(user=team.owner, form="/f/", token="t", fields=b"", create=create)

    first, second = sent_in_threads(lambda: sending(refused), lambda: sending(lambda: made.append(1) or "/ok/", 0.2))
    assert isinstance(first, ValidationError)
    assert (second.result, second.created, made) == ("/ok/", True, [1])


def test_a_sending_still_at_work_when_the_wait_ends_is_refused_with_try_again(transactional_db, team, monkeypatch):
    monkeypatch.setattr(submissions, "WAIT_FOR_FIRST_SECONDS", 0.3)

    def slow():
        time.sleep(1.5)
        return "/made/"

    def sending(late=0.0):
        time.sleep(late)
        return send_once(user=team.owner, form="/f/", token="t", fields=b"", create=slow)

    first, second = sent_in_threads(sending, lambda: sending(late=0.2))
    assert first.created and isinstance(second, SendingInProgress)
    assert second.messages == [submissions.STILL_BEING_PROCESSED]
    assert send_once(user=team.owner, form="/f/", token="t", fields=b"", create=slow) == \
        submissions.Sent(result="/made/", created=False)


def test_a_claim_left_by_a_dead_process_is_taken_over_once_old(team, monkeypatch):
    monkeypatch.setattr(submissions, "WAIT_FOR_FIRST_SECONDS", 0.1)
    send = lambda: send_once(user=team.owner, form="/f/", token="t", fields=b"", create=lambda: "/made/")  # noqa: E731
    claim = Submission.objects.create(user=team.owner, key=submissions._form_key("/f/", "t", b""),
                                      claimed_by="a-process-that-died")
    with pytest.raises(SendingInProgress):
        send()
    Submission.objects.filter(pk=claim.pk).update(created_at=timezone.now() - CLAIM_TAKEN_OVER_AFTER
                                                  - timedelta(seconds=1))
    assert send() == submissions.Sent(result="/made/", created=True)
    assert list(Submission.objects.values_list("result", "claimed_by")) == [("/made/", "")]


def test_a_sending_whose_claim_was_taken_over_keeps_nothing_it_made(transactional_db, team):
    """It outlived ``CLAIM_TAKEN_OVER_AFTER`` and a retry took its claim (committed while it prepared): the retry's
    work is the one kept."""
    def create():
        SetupStep.objects.create(name="made-by-the-first")
        return "/made/"

    with pytest.raises(SendingInProgress):
        send_once(user=team.owner, form="/f/", token="t", fields=b"", create=create,
                  prepare=lambda: Submission.objects.update(claimed_by="the-retry-that-took-it"))
    assert not SetupStep.objects.filter(name="made-by-the-first").exists()
    assert list(Submission.objects.values_list("claimed_by", flat=True)) == ["the-retry-that-took-it"]


def test_the_same_project_sent_twice_is_created_once(team, client_for):
    client = client_for(team.viewer)
    token = form_token(client.get("/projects/new/").content.decode())
    form = {"name": "Reward models", "slug": "reward-models", TOKEN_FIELD: token}
    first, second = client.post("/projects/new/", form), client.post("/projects/new/", form)
    # The second is not refused with "the slug reward-models is taken".
    assert first.status_code == second.status_code == 302 and first["Location"] == second["Location"] == "/p/reward-models/"


def test_counting_tokens_sent_twice_queues_one_count(team, client_for, monkeypatch, django_capture_on_commit_callbacks):
    sent = []
    monkeypatch.setattr(dataset_services.celery_app, "send_task", lambda name, args, queue: sent.append(name))
    base_model, version = make_base_model(team.project), make_ready_version(team.project)
    client = client_for(team.teammate)
    page_url = f"/p/alpha/datasets/{version.dataset.public_id}/v/1/"
    page = client.get(page_url).content.decode()
    fields = {"base_model": base_model.public_id, TOKEN_FIELD: form_token(page, after="/tokens/")}
    with django_capture_on_commit_callbacks(execute=True):
        responses = [client.post(f"{page_url}tokens/", fields) for _ in range(2)]
    assert [response["Location"] for response in responses] == [page_url, page_url]
    assert len(sent) == 1


@pytest.mark.parametrize("page_url, create_url, tokens", [
    ("/accounts/tokens/", "/accounts/tokens/", lambda user: ApiToken.objects.filter(user=user)),
    ("/p/alpha/chat/", "/p/alpha/chat/tokens/", lambda user: ProjectToken.objects.filter(user=user))])
def test_an_api_token_form_sent_twice_makes_one_token_and_says_its_secret_was_shown(
        team, client_for, page_url, create_url, tokens):
    """A token's secret is shown once: the repeat cannot show it again, so it makes nothing and says so."""
    client = client_for(team.teammate)
    token_of = lambda page: form_tokens(page)[-1]  # noqa: E731 (the token form is the page's last)
    fields = {"name": "ci", TOKEN_FIELD: token_of(client.get(page_url).content.decode())}
    first, second = (client.post(create_url, fields).content.decode() for _ in range(2))
    assert tokens(team.teammate).count() == 1
    assert 'id="new-token"' in first and 'id="new-token"' not in second
    assert secret_already_shown(token_name="ci") in html.unescape(second)
    # The form of the page that answered is a new sending: a second token.
    assert 'id="new-token"' in client.post(create_url, {"name": "ci", TOKEN_FIELD: token_of(second)}).content.decode()
    assert tokens(team.teammate).count() == 2


def test_a_repeat_of_a_revoked_tokens_sending_says_it_was_revoked(team, client_for):
    client = client_for(team.teammate)
    fields = {"name": "ci", TOKEN_FIELD: form_token(client.get("/accounts/tokens/").content.decode())}
    client.post("/accounts/tokens/", fields)
    ApiToken.objects.all().delete()
    page = html.unescape(client.post("/accounts/tokens/", fields).content.decode())
    assert secret_already_shown(token_name=None) in page and not ApiToken.objects.exists()


def test_a_token_sent_again_after_the_keeping_time_makes_the_thing_again(team):
    made = []

    def create():
        made.append(len(made))
        return f"/made/{len(made)}/"

    send_once(user=team.owner, form="/f/", token="t", fields=b"", create=create)
    Submission.objects.update(created_at=timezone.now() - timedelta(days=KEEP_DAYS, minutes=1))
    again = send_once(user=team.owner, form="/f/", token="t", fields=b"", create=create)
    assert (again.result, again.created) == ("/made/2/", True)
    assert Submission.objects.count() == 1  # the old record is gone, the new one kept


def test_a_token_longer_than_the_limit_is_refused_not_cut(team):
    # Cut at the limit, these two keys would have been one sending, the second answered with the first's run.
    first, second = "k" * MAX_TOKEN_CHARS + "1", "k" * MAX_TOKEN_CHARS + "2"
    for token in (first, second):
        with pytest.raises(ValidationError) as refused:
            send_once(user=team.owner, form="/f/", token=token, fields=b"", create=lambda: "/x/",
                      token_name="Idempotency-Key")
        assert refused.value.message_dict == {
            "Idempotency-Key": [f"Idempotency-Key is {MAX_TOKEN_CHARS + 1} characters long; "
                                f"it may be at most {MAX_TOKEN_CHARS}"]}
    assert send_once(user=team.owner, form="/f/", token="k" * MAX_TOKEN_CHARS, fields=b"",
                     create=lambda: "/x/").created


def test_a_large_upload_is_told_apart_by_its_name_size_and_ends_without_reading_its_middle(rf):
    """A 20 GB model archive was read whole to tell a repeat (``sample_files``): its name, size and first and last
    MiB tell a sending of the same file again, with the form's one-time token, which a changed form does not keep."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from webapp.core.submissions import SAMPLE_BYTES, _form_fields

    def fields(content: bytes, *, name: str = "model.zip", sample_files: bool = True) -> bytes:
        request = rf.post("/f/", {"name": "m", "archive": SimpleUploadedFile(name, content)})
        return _form_fields(request, sample_files=sample_files)

    content = bytes(range(256)) * (3 * SAMPLE_BYTES // 256)
    middle, first, last = len(content) // 2, 10, len(content) - 10
    changed = {at: content[:at] + b"\xff" + content[at + 1:] for at in (middle, first, last)}
    assert fields(changed[middle]) == fields(content) != fields(changed[middle], sample_files=False)
    others = {fields(changed[first]), fields(changed[last]), fields(content + b"x"), fields(content, name="b.zip")}
    assert len(others) == 4 and fields(content) not in others
