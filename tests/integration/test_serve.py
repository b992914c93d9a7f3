"""Generations on a real serve worker (thread pool) over a real Redis: concurrent chats stream their
tokens as events and complete; a stop flag ends a generation."""
from __future__ import annotations

import pytest

from tests.factories import build_tiny_model_dir
from tests.live import wait_for
from webapp.celery import app
from webapp.chat import channels
from webapp.runs.channels import redis_client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-serve-worker"))


@pytest.fixture
def serve_worker(celery_workers, settings, redis_url):
    settings.REDIS_URL = redis_url
    celery_workers.ensure("serve")
    client = redis_client()
    return celery_workers, client


def send(model_dir, generation_id, **fields):
    app.send_task("worker.tasks.serve.generate", args=[{
        "id": generation_id, "model_key": "tiny", "model_path": str(model_dir),
        "messages": [{"role": "user", "content": f"Hello {generation_id}"}], "temperature": 0.0, **fields}])


def finished(client, generation_id):
    events = channels.stored_events(client, generation_id)
    return events if events and events[-1]["type"] in channels.TERMINAL_TYPES else None


def test_concurrent_chats_stream_and_complete(serve_worker, tiny_model_dir):
    workers, client = serve_worker
    ids = [f"chat-{i}" for i in range(4)]
    for generation_id in ids:
        send(tiny_model_dir, generation_id, max_new_tokens=16)
    for generation_id in ids:
        events = wait_for(lambda: finished(client, generation_id), timeout=90, workers=workers,
                          what=f"generation {generation_id}")
        assert [event["type"] for event in events] == ["token"] * 16 + ["done"]
        assert "".join(event["text"] for event in events[:-1]) == events[-1]["text"]


def test_a_stopped_generation_ends_as_cancelled(serve_worker, tiny_model_dir):
    # Mid-answer stops are timed in tests/worker/test_serve.py; the tiny model here answers 150 tokens
    # faster than a test can react, so the flag is raised before the worker reads it.
    workers, client = serve_worker
    channels.request_stop(client, "stopped")
    send(tiny_model_dir, "stopped", max_new_tokens=150)
    events = wait_for(lambda: finished(client, "stopped"), timeout=90, workers=workers, what="the stopped answer")
    assert events[-1].get("finish_reason") == "cancelled", events[-1]
    assert events[-1]["completion_tokens"] == 0
