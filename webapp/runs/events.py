"""Server-sent events of one run: an async view that relays the run's Redis channel.

Each connection subscribes with ``redis.asyncio`` and forwards every published event as one SSE
message (``data: <json>``), with a comment line every ``KEEPALIVE_SECONDS`` so proxies keep the
connection open. A stream ends after ``MAX_STREAM_SECONDS`` (the browser's EventSource reconnects
by itself) or once the run has finished. The page fills any gap (points published before it
subscribed) from the JSON endpoint when the stream opens, and falls back to polling it when
server-sent events do not get through.
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

from webapp.runs import channels
from webapp.runs.access import get_run_for_user

logger = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15.0
MAX_STREAM_SECONDS = 600.0
TERMINAL = {"succeeded", "failed", "cancelled"}


async def _relay(public_id: str, status: str) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    yield f"data: {json.dumps({'type': 'hello', 'status': status})}\n\n"
    if status in TERMINAL:
        return
    client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=channels.REDIS_TIMEOUT_SECONDS)
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(channels.events_channel(public_id))
        deadline = time.monotonic() + MAX_STREAM_SECONDS
        last_sent = time.monotonic()
        while time.monotonic() < deadline:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is None:
                if time.monotonic() - last_sent > KEEPALIVE_SECONDS:
                    yield ": keepalive\n\n"
                    last_sent = time.monotonic()
                continue
            data = message["data"].decode() if isinstance(message["data"], bytes) else str(message["data"])
            yield f"data: {data}\n\n"
            last_sent = time.monotonic()
            if json.loads(data).get("type") == "status" and json.loads(data).get("status") in TERMINAL:
                return
    except (aioredis.RedisError, OSError) as error:
        logger.warning("run %s: live stream stopped, Redis unavailable: %s", public_id, error)
        yield f"data: {json.dumps({'type': 'unavailable'})}\n\n"
    except asyncio.CancelledError:
        raise
    finally:
        try:
            await pubsub.aclose()
            await client.aclose()
        except (aioredis.RedisError, OSError):
            pass


async def run_events(request: HttpRequest, slug: str, run_id: str) -> StreamingHttpResponse:
    """``text/event-stream`` of the run's live events (see the module notes)."""
    user = await request.auser()
    _project, _membership, run = await sync_to_async(get_run_for_user)(user, slug, run_id)
    response = StreamingHttpResponse(_relay(run.public_id, run.status), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
