"""The shared SSE relay against a real Redis: backlog replay, no event twice, terminal event."""
import asyncio
import json
import threading
import time

import pytest
import redis
from django.core.signals import request_finished
from django.db import close_old_connections
from django.http import StreamingHttpResponse
from django.test import RequestFactory, override_settings

from webapp.core import sse
from webapp.core.sse import HANDOFF_MESSAGES, event_stream_response, relay_channel, sse_message


def test_sse_message_encodes_json_once():
    assert sse_message({"type": "token", "text": "<b>"}) == 'data: {"type": "token", "text": "<b>"}\n\n'
    assert sse_message('{"already": "json"}') == 'data: {"already": "json"}\n\n'


def _collect(redis_url: str, *, channel: str, backlog_key: str | None, publish: list[dict]) -> list[dict]:
    """Run the relay while another client publishes ``publish`` once it has subscribed."""
    client = redis.Redis.from_url(redis_url)

    async def scenario() -> list[dict]:
        received: list[dict] = []

        async def publisher():
            while client.pubsub_numsub(channel)[0][1] == 0:  # wait for the relay's subscription
                await asyncio.sleep(0.01)
            for event in publish:
                client.publish(channel, json.dumps(event))

        task = asyncio.create_task(publisher())
        with override_settings(REDIS_URL=redis_url):
            async for message in relay_channel(channel, backlog_key=backlog_key, max_seconds=10, label="test",
                                               is_terminal=lambda event: event["type"] == "done"):
                received.append(json.loads(message.removeprefix("data: ")))
        await task
        return received

    return asyncio.run(scenario())


def test_it_replays_the_backlog_then_forwards_only_new_events(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.delete("test:sse:events")
    for seq in (0, 1):
        client.rpush("test:sse:events", json.dumps({"seq": seq, "type": "token"}))
    received = _collect(redis_url, channel="test:sse", backlog_key="test:sse:events", publish=[
        {"seq": 1, "type": "token"},  # published before the backlog was read: already sent
        {"seq": 2, "type": "token"},
        {"seq": 3, "type": "done"},
        {"seq": 4, "type": "token"},  # after the terminal event: never sent
    ])
    assert [event["seq"] for event in received] == [0, 1, 2, 3]


def test_it_forwards_events_without_seq_until_the_terminal_one(redis_url):
    received = _collect(redis_url, channel="test:sse:plain", backlog_key=None, publish=[
        {"type": "metrics", "value": 1}, {"type": "metrics", "value": 1}, {"type": "done"}])
    assert received == [{"type": "metrics", "value": 1}, {"type": "metrics", "value": 1}, {"type": "done"}]


def test_streams_at_once_share_one_pub_sub_connection_and_each_gets_its_own_channel(redis_url):
    client = redis.Redis.from_url(redis_url)
    channels = ["test:sse:a", "test:sse:b", "test:sse:b", "test:sse:c"]  # two streams of one channel
    # Counted against the server's pub/sub connections before: a live Celery worker of the session holds one
    # (its remote-control broadcast).
    before = len(client.client_list(_type="pubsub"))

    async def scenario():
        with override_settings(REDIS_URL=redis_url):
            streams = [relay_channel(channel, max_seconds=10, label="test", opening=("data: open\n\n",),
                                     is_terminal=lambda event: event["type"] == "done") for channel in channels]
            for stream in streams:
                await anext(stream)  # subscribed
            connections = len(client.client_list(_type="pubsub"))
            for channel in dict.fromkeys(channels):
                client.publish(channel, json.dumps({"type": "token", "on": channel}))
                client.publish(channel, json.dumps({"type": "done", "on": channel}))
            received = [[json.loads(message.removeprefix("data: ")) async for message in stream] for stream in streams]
        return connections, received

    connections, received = asyncio.run(scenario())
    assert connections == before + 1
    for channel, events in zip(channels, received):
        assert events == [{"type": "token", "on": channel}, {"type": "done", "on": channel}]
    assert len(client.client_list(_type="pubsub")) == before  # closed with the last stream


def test_a_stream_that_takes_nothing_is_ended_instead_of_queueing_without_bound(redis_url, monkeypatch):
    monkeypatch.setattr(sse, "SUBSCRIPTION_QUEUE_MESSAGES", 3)
    client = redis.Redis.from_url(redis_url)

    async def scenario() -> list[str]:
        with override_settings(REDIS_URL=redis_url):
            stream = relay_channel("test:sse:slow", max_seconds=10, label="test", opening=("data: open\n\n",),
                                   is_terminal=lambda event: event["type"] == "done")
            received = [await anext(stream)]  # subscribed
            for number in range(5):  # the stream takes none of them meanwhile
                client.publish("test:sse:slow", json.dumps({"type": "token", "number": number}))
            while len(received) < 2:
                await asyncio.sleep(0.01)
                received += [message async for message in stream]
            return received

    assert asyncio.run(scenario()) == ["data: open\n\n", sse_message({"type": "unavailable"})]


def test_it_reports_an_unreachable_redis():
    async def scenario():
        with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
            return [message async for message in relay_channel("x", is_terminal=lambda e: True, max_seconds=1,
                                                               label="test")]

    assert asyncio.run(scenario()) == [sse_message({"type": "unavailable"})]


def _wsgi_stream(stream) -> StreamingHttpResponse:
    """``stream`` as a WSGI server (runserver, the live test server) is handed it."""
    return event_stream_response(RequestFactory().get("/events/"), stream)


def _close_as_the_server_does(response: StreamingHttpResponse) -> None:
    """``response.close()``, as a WSGI server calls it when the browser goes away, without the
    ``request_finished`` receiver that checks this thread's database connection. These tests use no
    database: alone they hold no connection and the check does nothing, but after any database test
    in the same process (``pytest -n 8`` put tests/webapp/runs/test_views.py first) the thread holds
    that test's connection, and pytest-django refuses the check's query. Django's test client closes
    its responses the same way."""
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)


def _sse_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "sse-stream"]


def test_a_stream_closed_by_a_departed_client_finishes_its_cleanup_and_its_thread():
    """The stream's ``finally`` awaits (as the relay's unsubscribe and close do): closing the
    response must let those run to their end, not drop the task half-way."""
    cleaned, started = [], threading.Event()

    async def endless():
        try:
            started.set()
            while True:
                yield "data: tick\n\n"
                await asyncio.sleep(0.01)
        finally:
            await asyncio.sleep(0.05)
            await asyncio.sleep(0.05)
            cleaned.append("unsubscribed")

    response = _wsgi_stream(endless())
    messages = iter(response)
    assert next(messages) == b"data: tick\n\n"
    _close_as_the_server_does(response)  # the browser went away
    deadline = time.monotonic() + 5
    while _sse_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cleaned == ["unsubscribed"]
    assert _sse_threads() == []


def test_a_stream_that_ends_by_itself_leaves_no_thread_and_its_error_reaches_the_server():
    async def two_then_fail():
        yield "data: 1\n\n"
        yield "data: 2\n\n"
        raise ConnectionError("redis went away")

    messages = iter(_wsgi_stream(two_then_fail()))
    assert [next(messages), next(messages)] == [b"data: 1\n\n", b"data: 2\n\n"]
    with pytest.raises(ConnectionError, match="redis went away"):
        next(messages)
    deadline = time.monotonic() + 5
    while _sse_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _sse_threads() == []


def test_a_client_that_stops_reading_holds_the_stream_back_instead_of_piling_messages_up():
    """The server's write blocks while the client reads nothing: the stream must wait too (its
    messages wait in its subscription's bounded queue, which ends a stream too far behind), not queue
    every message in the web process until ``max_seconds``."""
    produced = []

    async def fast():
        while True:
            produced.append(len(produced))
            yield f"data: {len(produced)}\n\n"
            await asyncio.sleep(0)

    response = _wsgi_stream(fast())
    messages = iter(response)
    next(messages)
    time.sleep(0.5)  # the client reads nothing for a while
    assert len(produced) <= HANDOFF_MESSAGES + 2
    assert [next(messages) for _ in range(3)] == [b"data: 2\n\n", b"data: 3\n\n", b"data: 4\n\n"]
    _close_as_the_server_does(response)
    deadline = time.monotonic() + 5
    while _sse_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _sse_threads() == []
