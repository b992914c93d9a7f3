"""Server-sent events relayed from a Redis pub/sub channel, shared by every live page.

Design note: a live stream must neither lose nor repeat an event when the page connects late.
Publishers that need that (chat answers) also append each event, numbered by ``seq``, to a Redis
list: the relay subscribes first, then replays that backlog, then forwards only channel events
whose ``seq`` is past the last one sent. Publishers that do not (run metrics, where the page
fills gaps from a JSON endpoint) simply omit the backlog. A comment line every
``KEEPALIVE_SECONDS`` keeps proxies from closing an idle stream; a stream ends at its terminal
event or after ``max_seconds`` (a browser's EventSource reconnects by itself).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import redis.asyncio as aioredis
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, StreamingHttpResponse

logger = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15.0
REDIS_CONNECT_TIMEOUT_SECONDS = 2.0
# Messages a WSGI stream may hold for a client that reads nothing (its server's write blocks);
# past that the stream waits, and Redis, not this process, holds what comes next.
HANDOFF_MESSAGES = 64
HANDOFF_WAIT_SECONDS = 0.02


def sse_message(event: dict | str) -> str:
    """One SSE message carrying ``event`` as JSON (a string is sent as it is)."""
    return f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n"


def event_stream_response(request: HttpRequest, stream: AsyncIterator[str]) -> StreamingHttpResponse:
    """A ``text/event-stream`` response that proxies neither cache nor buffer, its ``stream`` served
    the way the server serving ``request`` iterates (see the module note)."""
    content = stream if isinstance(request, ASGIRequest) else _iterate_in_thread(stream)
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _iterate_in_thread(stream: AsyncIterator[str]) -> Iterator[str]:
    """``stream``'s items, one by one as they come, from an event loop in a thread of its own.
    Closing this generator (the WSGI server does when the client goes away) cancels the stream, so
    its ``finally`` (unsubscribe, close the Redis client) runs."""
    handoff: queue.Queue[tuple[str, object]] = queue.Queue(maxsize=HANDOFF_MESSAGES)

    async def hand_over(kind: str, value: object) -> None:
        # Not handoff.put(): a blocking put would stop the loop, and with it the cancel that
        # closing this generator sends.
        while True:
            try:
                return handoff.put_nowait((kind, value))
            except queue.Full:
                await asyncio.sleep(HANDOFF_WAIT_SECONDS)

    async def pump() -> None:
        # Nothing is handed over once cancelled: the consumer is gone, and a full queue would
        # never drain.
        try:
            async for item in stream:
                await hand_over("item", item)
        except Exception as error:  # raised again in the consumer's thread
            await hand_over("error", error)
        else:
            await hand_over("end", None)

    loop = asyncio.new_event_loop()
    pumping = loop.create_task(pump())

    def run_loop() -> None:
        # Until the task is done, not until the loop is told to stop: a cancelled stream's
        # ``finally`` awaits (unsubscribe, close the client), and a loop stopped at the cancel
        # left those pending and the Redis connection open ("Task was destroyed but it is pending").
        try:
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(pumping)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    threading.Thread(target=run_loop, name="sse-stream", daemon=True).start()
    try:
        while True:
            kind, value = handoff.get()
            if kind == "end":
                return
            if kind == "error":
                raise value  # type: ignore[misc]
            yield value  # type: ignore[misc]
    finally:
        # The loop is closed once the stream has ended by itself: nothing is left to cancel then.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(pumping.cancel)


async def relay_channel(channel: str, *, is_terminal: Callable[[dict], bool], max_seconds: float,
                        backlog_key: str | None = None, opening: tuple[str, ...] = (),
                        label: str) -> AsyncIterator[str]:
    """SSE messages of the JSON events published on ``channel`` (see the module note).

    ``opening`` is sent once the channel is subscribed: a page that catches up when it reads it
    misses nothing published after its catch-up. ``backlog_key`` names a Redis list of the events
    published so far, each with a ``seq``. When Redis is unreachable the stream sends
    ``{"type": "unavailable"}`` and ends; ``label`` names the stream in that log line.
    """
    client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=REDIS_CONNECT_TIMEOUT_SECONDS)
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(channel)
        for message in opening:
            yield message
        last_seq = -1
        if backlog_key is not None:
            for raw in await client.lrange(backlog_key, 0, -1):
                event = json.loads(raw)
                last_seq = event.get("seq", last_seq)
                yield sse_message(event)
                if is_terminal(event):
                    return
        deadline = time.monotonic() + max_seconds
        last_sent = time.monotonic()
        while time.monotonic() < deadline:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is None:
                if time.monotonic() - last_sent > KEEPALIVE_SECONDS:
                    yield ": keepalive\n\n"
                    last_sent = time.monotonic()
                continue
            event = json.loads(message["data"])
            seq = event.get("seq")
            if seq is not None:
                if seq <= last_seq:
                    continue
                last_seq = seq
            yield sse_message(event)
            last_sent = time.monotonic()
            if is_terminal(event):
                return
    except (aioredis.RedisError, OSError) as error:
        logger.warning("%s: live stream stopped, Redis unavailable: %s", label, error)
        yield sse_message({"type": "unavailable"})
    finally:
        try:
            await pubsub.aclose()
            await client.aclose()
        except (aioredis.RedisError, OSError):
            pass
