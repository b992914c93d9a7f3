"""Server-sent events of one answer: an async view relaying the generation's Redis events.

The view subscribes to the generation's channel first, then reads the events stored so far, then
forwards channel events whose ``seq`` is past the last one sent (``webapp.chat.channels``), so a
page that connects late still gets every token once. The stream ends with the ``done`` or ``error``
event, or after ``MAX_STREAM_SECONDS``. An answer already finished in the database is sent as one
``done`` event without touching Redis.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, StreamingHttpResponse

from webapp.chat import channels
from webapp.chat.access import get_message_for_user
from webapp.chat.models import MessageStatus

logger = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15.0
MAX_STREAM_SECONDS = 300.0
FINISH_REASON = {MessageStatus.COMPLETE: "stop", MessageStatus.STOPPED: "cancelled", MessageStatus.TIMEOUT: "timeout"}


def _sse(event: dict | str) -> str:
    return f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n"


async def relay(generation_id: str) -> AsyncIterator[str]:
    """SSE lines of one generation's events until its terminal event (see the module note)."""
    client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2.0)
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(channels.channel(generation_id))
        last_seq = -1
        for raw in await client.lrange(channels.events_key(generation_id), 0, -1):
            event = json.loads(raw)
            last_seq = event["seq"]
            yield _sse(event)
            if event["type"] in channels.TERMINAL_TYPES:
                return
        deadline = time.monotonic() + MAX_STREAM_SECONDS
        last_sent = time.monotonic()
        while time.monotonic() < deadline:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is None:
                if time.monotonic() - last_sent > KEEPALIVE_SECONDS:
                    yield ": keepalive\n\n"
                    last_sent = time.monotonic()
                continue
            event = json.loads(message["data"])
            if event["seq"] <= last_seq:
                continue
            last_seq = event["seq"]
            yield _sse(event)
            last_sent = time.monotonic()
            if event["type"] in channels.TERMINAL_TYPES:
                return
    except (aioredis.RedisError, OSError) as error:
        logger.warning("generation %s: live stream stopped, Redis unavailable: %s", generation_id, error)
        yield _sse({"type": "unavailable"})
    except asyncio.CancelledError:
        raise
    finally:
        try:
            await pubsub.aclose()
            await client.aclose()
        except (aioredis.RedisError, OSError):
            pass


async def _finished(message) -> AsyncIterator[str]:
    if message.status == MessageStatus.FAILED:
        yield _sse({"seq": 0, "type": "error", "message": message.error})
    else:
        yield _sse({"seq": 0, "type": "done", "text": message.content, "finish_reason": FINISH_REASON[message.status],
                    "completion_tokens": message.completion_tokens})


async def message_events(request: HttpRequest, slug: str, conversation_id: str, message_id: str
                         ) -> StreamingHttpResponse:
    """``text/event-stream`` of an answer's events."""
    user = await request.auser()
    _project, _conversation, message = await sync_to_async(get_message_for_user)(
        user, slug, conversation_id, message_id)
    stream = relay(message.public_id) if message.status == MessageStatus.STREAMING else _finished(message)
    response = StreamingHttpResponse(stream, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
