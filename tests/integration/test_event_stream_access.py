"""A browser's live streams (a chat answer's tokens, a run's events) end within ``sse.ACCESS_RECHECK_SECONDS`` (2 s) of
their viewer losing the right to them, as a ``/v1`` answer does when its token's user does: removed from the
project, the account deactivated, or signed out everywhere by a new password. Against the real ASGI server and
Redis, over HTTP with the browser's session cookie. They went on: a removed member's for 15 s, a deactivated
account's or a changed password's to the stream's own end (5 minutes for an answer, 10 for a run)."""
from __future__ import annotations

import http.client
import threading
import time
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from tests.browser.test_runs import asgi_server, queued_run  # noqa: F401  (uvicorn on the test database and Redis)
from tests.webapp.factories import make_base_model, make_team
from webapp.chat import channels
from webapp.chat import services as chat_services
from webapp.chat.selectors import model_choice
from webapp.projects.models import Membership
from webapp.projects.services import membership_remove
from webapp.runs.channels import redis_client

pytestmark = pytest.mark.integration

# The /v1 API's recheck (2 s), plus the stream's wait for its next event (at most 1 s), plus a second to spare.
ENDS_WITHIN_SECONDS = 4.0


def remove_from_project(user, project) -> None:
    membership_remove(membership=Membership.objects.get(project=project, user=user))


def deactivate(user, project) -> None:
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)


def change_password(user, project) -> None:
    account = get_user_model().objects.get(pk=user.pk)
    account.set_password("a-new-long-phrase")
    account.save()


LOSSES = [remove_from_project, deactivate, change_password]


def session_of(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def open_stream(server: str, path: str, session: str) -> http.client.HTTPResponse:
    address = urlsplit(server)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=ENDS_WITHIN_SECONDS + 10)
    connection.request("GET", path, headers={"Cookie": f"{settings.SESSION_COOKIE_NAME}={session}",
                                             "Accept": "text/event-stream"})
    response = connection.getresponse()
    assert (response.status, response.getheader("Content-Type")) == (200, "text/event-stream")
    return response


def read_until(response: http.client.HTTPResponse, text: bytes) -> None:
    while text not in (line := response.readline()):
        assert line, f"the stream ended before {text!r}"


def seconds_to_end(response: http.client.HTTPResponse) -> tuple[float, list[bytes]]:
    """How long the stream went on from now, and its data lines meanwhile."""
    started, lines = time.monotonic(), []
    while line := response.readline():
        if line.startswith(b"data: "):
            lines.append(line)
    return time.monotonic() - started, lines


@pytest.fixture
def team(transactional_db, redis_url, settings):
    settings.REDIS_URL = redis_url  # the server's: the test writes the answer's events there
    return make_team()


@pytest.mark.parametrize("lose_access", LOSSES, ids=lambda lose: lose.__name__)
def test_an_answers_stream_ends_when_its_viewer_loses_access(asgi_server, team, monkeypatch,  # noqa: F811
                                                             lose_access):
    monkeypatch.setattr(chat_services.celery_app, "send_task", lambda *args, **kwargs: None)  # a worker, by hand
    model = model_choice(project=team.project, ref=make_base_model(team.project).public_id)
    conversation = chat_services.conversation_create(project=team.project, user=team.teammate, model=model)
    answer = chat_services.message_send(conversation=conversation, model=model, content="Hello")
    redis = redis_client()
    channels.emit(redis, answer.public_id, {"seq": 0, "type": "token", "text": "Hel"})
    response = open_stream(asgi_server, reverse("chat:events", args=[team.project.slug, conversation.public_id,
                                                                     answer.public_id]), session_of(team.teammate))
    read_until(response, b'"Hel"')
    writing, seq = threading.Event(), iter(range(1, 10_000))

    def write_on() -> None:  # the worker goes on writing the answer
        while not writing.wait(0.25):
            channels.emit(redis, answer.public_id, {"seq": next(seq), "type": "token", "text": "lo"})

    writer = threading.Thread(target=write_on)
    writer.start()
    try:
        time.sleep(0.5)
        lose_access(team.teammate, team.project)
        went_on, lines = seconds_to_end(response)
    finally:
        writing.set()
        writer.join()
    assert went_on < ENDS_WITHIN_SECONDS
    assert lines and not any(b'"done"' in line for line in lines)  # tokens until the recheck, then the end


@pytest.mark.parametrize("lose_access", LOSSES, ids=lambda lose: lose.__name__)
def test_a_runs_stream_ends_when_its_viewer_loses_access(asgi_server, team, monkeypatch,  # noqa: F811
                                                         lose_access):
    run = queued_run(monkeypatch, team, name="watched")
    response = open_stream(asgi_server, reverse("runs:events", args=[team.project.slug, run.public_id]),
                           session_of(team.viewer))
    read_until(response, b'"hello"')
    lose_access(team.viewer, team.project)
    went_on, _lines = seconds_to_end(response)
    assert went_on < ENDS_WITHIN_SECONDS
