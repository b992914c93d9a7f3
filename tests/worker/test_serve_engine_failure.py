"""A serve worker whose engine fails to import (a broken install, a half-deployed upgrade) must end the
chat answer as failed with the reason, and tell the page so, instead of leaving it streaming for ever
(the page then waits in silence and the conversation refuses every new message)."""
from __future__ import annotations

import sys

import pytest

from tests.webapp.factories import make_team
from webapp.chat import channels
from webapp.chat.models import Conversation, Message, MessageStatus, Role
from webapp.runs.channels import redis_client
from worker.tasks import serve

pytestmark = pytest.mark.django_db


def test_an_engine_that_does_not_import_fails_the_answer_with_the_reason(redis_server, settings, monkeypatch):
    settings.REDIS_URL = redis_server.url
    client = redis_client()
    client.flushdb()
    team = make_team()
    conversation = Conversation.objects.create(project=team.project, user=team.teammate, model_ref="bm_x",
                                               model_label="tiny")
    Message.objects.create(conversation=conversation, role=Role.USER, content="hi")
    answer = Message.objects.create(conversation=conversation, role=Role.ASSISTANT, status=MessageStatus.STREAMING)
    monkeypatch.setitem(sys.modules, "jaxengine.serving", None)  # `from jaxengine.serving import …` raises ImportError

    result = serve.generate({"id": answer.public_id, "message": answer.public_id, "model_key": "tiny",
                             "model_path": "/models/tiny", "project_slug": "alpha", "messages": [{"role": "user", "content": "hi"}]})

    assert result["error"].startswith("the serve worker could not load the engine: ")
    assert "jaxengine.serving" in result["error"]
    answer.refresh_from_db()
    assert answer.status == MessageStatus.FAILED and answer.error == result["error"]
    [event] = channels.stored_events(client, answer.public_id)
    assert event["type"] == "error" and event["message"] == result["error"]
