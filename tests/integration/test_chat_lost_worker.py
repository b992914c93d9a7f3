"""A chat answer whose serve worker is killed (SIGKILL) mid-answer, end to end: a real serve worker (thread
pool) over a real Redis, killed after it streamed part of an answer; the reapers of the next serve worker queue
the dead worker's message again (``webapp.workers.deliveries``), and the worker that takes it ends the answer
with ``serve.WORKER_LOST`` after the words the page already showed, rather than writing it again from the start.
The conversation then goes on: the next message is answered.

Mid-answer by construction: the answer is 900 greedy tokens of a tiny model given room for them (hundreds of
decode calls, seconds of decoding), and the moment its first token is published the test pauses every write to
Redis (``CLIENT PAUSE WRITE``), so the worker can neither stream more nor end the answer until it is dead. The
workers run with the short timings of tests/integration/test_review_generation.py."""
from __future__ import annotations

import json
import os
import signal

import pytest

from tests.factories import build_tiny_model_dir
from tests.live import environment, wait_for
from tests.webapp.factories import make_base_model, make_team
from webapp.chat import channels, services
from webapp.chat.models import Conversation, Message, MessageStatus
from webapp.chat.selectors import model_choice
from webapp.runs.channels import redis_client
from worker.tasks.serve import WORKER_LOST

pytestmark = pytest.mark.integration

FAST_TIMINGS = {"TEMPER_RUN_HEARTBEAT_SECONDS": "1", "TEMPER_RUN_LOST_SECONDS": "6", "TEMPER_REAPER_SECONDS": "2",
                "TEMPER_HEARTBEAT_SECONDS": "1"}
LONG_ANSWER_TOKENS = 900  # greedy, this prompt: no end-of-text token before the limit (finish_reason "length")


@pytest.fixture(scope="module")
def long_context_model_dir(tmp_path_factory):
    """The tiny model with 1024 positions instead of its preset's 256, so that an answer can be long."""
    model_dir = build_tiny_model_dir(tmp_path_factory.mktemp("tiny-chat-lost-worker"))
    config = json.loads((model_dir / "config.json").read_text())
    config["max_position_embeddings"] = 1024
    (model_dir / "config.json").write_text(json.dumps(config))
    return model_dir


@pytest.fixture
def fast_timings():
    with environment(FAST_TIMINGS):
        yield


def answered(answer: Message):
    def check():
        row = Message.objects.get(pk=answer.pk)
        return row if row.status != MessageStatus.STREAMING else None
    return check


def test_an_answer_whose_serve_worker_died_ends_saying_so_and_the_next_message_is_answered(
        fast_timings, celery_workers, transactional_db, settings, redis_url, long_context_model_dir):
    settings.REDIS_URL = redis_url
    workers = celery_workers
    workers.ensure("serve")
    team = make_team()
    base_model = make_base_model(team.project, name="tiny", path=str(long_context_model_dir))
    model = model_choice(project=team.project, ref=base_model.public_id)
    conversation = services.conversation_create(project=team.project, user=team.teammate, model=model,
                                                temperature=0.0, max_tokens=LONG_ANSWER_TOKENS)
    client = redis_client()
    listener = client.pubsub(ignore_subscribe_messages=True)
    listener.psubscribe(channels.channel("msg_*"))  # before the answer exists: its first event cannot be missed
    answer = services.message_send(conversation=conversation, model=model, content="Tell me a long story.")

    def first_token():
        event = listener.get_message(timeout=0.05)
        return (event is not None and event["channel"] == channels.channel(answer.public_id).encode()
                and json.loads(event["data"])["type"] == "token")
    wait_for(first_token, timeout=120, interval=0, workers=workers, what="the answer's first token")
    client.client_pause(60_000, all=False)  # writes wait (the worker's next event among them); reads go on
    try:
        shown = channels.stored_events(client, answer.public_id)
        assert shown[-1]["type"] == "token", f"the answer ended before the test paused Redis: {shown[-1]}"
        worker = workers.running["serve"]
        os.killpg(worker.process.pid, signal.SIGKILL)
        worker.process.wait(timeout=10)
    finally:
        client.client_unpause()
        listener.close()
    assert sum(event.get("tokens", 0) for event in shown) < LONG_ANSWER_TOKENS
    assert Message.objects.get(pk=answer.pk).status == MessageStatus.STREAMING

    workers.ensure("serve")  # as its supervisor would start it; its reaper queues the dead worker's message again
    answer = wait_for(answered(answer), timeout=60, workers=workers, what="the lost answer to end")
    assert answer.status == MessageStatus.FAILED and answer.error == WORKER_LOST
    events = channels.stored_events(client, answer.public_id)
    # What the page showed stays as it was, and the error follows it, numbered after it.
    assert events == [*shown, {"seq": len(shown), "type": "error", "message": WORKER_LOST}]

    Conversation.objects.filter(pk=conversation.pk).update(max_tokens=12)
    conversation.refresh_from_db()
    following = services.message_send(conversation=conversation, model=model, content="And a short one?")
    following = wait_for(answered(following), timeout=120, workers=workers, what="the next answer")
    assert following.status == MessageStatus.COMPLETE and following.error == "", following.error
    done = channels.stored_events(client, following.public_id)[-1]
    assert done["type"] == "done" and done["completion_tokens"] == following.completion_tokens > 0
