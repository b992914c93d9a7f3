"""Server-sent events relayed from a Redis pub/sub channel, shared by every live page.

Design note: a live stream must neither lose nor repeat an event when the page connects late.
Publishers that need that (chat answers) also append each event, numbered by ``seq``, to a Redis
list: the relay subscribes first, then replays that backlog, then forwards only channel events
whose ``seq`` is past the last one sent. Publishers that do not (run metrics, where the page
fills gaps from a JSON endpoint) simply omit the backlog. A comment line every
``KEEPALIVE_SECONDS`` keeps proxies from closing an idle stream; a stream ends at its terminal
event or after ``max_seconds`` (a browser's EventSource reconnects by itself).

The streams an event loop serves at once share one Redis client and one pub/sub connection
(``_Subscriber``): a reader task hands each message to the queues of the streams subscribed to its
channel. A stream used to open and handshake two connections of its own (redis-py 8 also reads its
package metadata for each): relaying one answer of 17 events among 16 at once cost 3.6-4.1 ms of CPU
in the web process, 2.7-3.0 ms shared (bench/RESULTS.md), and an open page held a Redis connection.
The shared ones are closed when the last stream ends, so an idle process holds none and an event loop
that ends (a WSGI stream's, a test's) leaves none open.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from importlib import import_module

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model, load_backend
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.core.handlers.asgi import ASGIRequest
from django.db import DatabaseError
from django.http import Http404, HttpRequest, StreamingHttpResponse
from django.utils.crypto import constant_time_compare

from webapp.core.streams import release_connections

logger = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15.0
# How often a long-lived answer asks again whether its client may still have it: the browser's streams here
# (``relay_channel``'s ``access_lost``, ``session_access_lost``) and the /v1 API's answers (its token's standing,
# ``chat.openai_api``) alike. A member removed from the project, an account deactivated or signed out by a new
# password, a token revoked, an object deleted: no more of it after that long (one or two indexed queries a stream).
ACCESS_RECHECK_SECONDS = 2.0
REDIS_CONNECT_TIMEOUT_SECONDS = 2.0
# Messages a WSGI stream may hold for a client that reads nothing (its server's write blocks);
# past that the stream waits, and its subscription's queue holds what comes next.
HANDOFF_MESSAGES = 64
HANDOFF_WAIT_SECONDS = 0.02
# Messages a subscription's queue holds for a stream that does not take them (its client reads nothing);
# past that the stream is ended, as Redis ends a pub/sub client too far behind. A chat answer's events
# (1,025 at most: 8,192 tokens, 8 an event) fit four times.
SUBSCRIPTION_QUEUE_MESSAGES = 4096


class FellBehind(Exception):
    """A stream's subscription queue filled up (``SUBSCRIPTION_QUEUE_MESSAGES``): its client reads nothing."""


# Why a long-lived response's client may no longer read it, in words for the log; None while it may.
AccessLost = Callable[[], Awaitable[str | None]]


def access_lost_when(who: Callable[[], AbstractBaseUser | None], lookup: Callable[[AbstractBaseUser], object]
                     ) -> AccessLost:
    """The ``access_lost`` of a long-lived response (``relay_channel``, ``streaming.asynchronous``): why, once
    ``who()``, the client's authentication read again (its session, its token), gives no account (signed out, a
    new password, the account deactivated or deleted, the token revoked or expired), or once ``lookup(user)``, the
    view's own access check run again with the account as it is now, refuses (404: no longer a member, or the object
    is gone; 403). A database error counts as neither: asked again next time, as the /v1 API does."""
    def refused() -> str | None:
        try:
            user = who()
            if user is None:
                return ("its sign-in no longer holds (signed out, a new password, the account deactivated, "
                        "the token revoked or expired)")
            lookup(user)
        except Http404 as error:
            return f"its access check refuses it now (404: {error})"
        except PermissionDenied as error:
            return f"its access check refuses it now (403: {error})"
        except DatabaseError as error:
            logger.warning("a long-lived response's access could not be read again: %s", error)
        finally:  # a stream's connection goes back to the pool between checks (webapp.core.streams)
            release_connections()
        return None

    async def access_lost() -> str | None:
        return await sync_to_async(refused)()
    return access_lost


def session_access_lost(request: HttpRequest, lookup: Callable[[AbstractBaseUser], object]) -> AccessLost:
    """``access_lost_when`` for a response a browser asked for with its session (``_session_user``)."""
    session_key = request.session.session_key
    return access_lost_when(lambda: _session_user(session_key), lookup)


def _session_user(session_key: str | None) -> AbstractBaseUser | None:
    """The account the session ``session_key`` signs in now, as Django's authentication middleware would take it
    for the next request (the session still there, its backend's user, active, the password it was made with),
    without that middleware's writes to the session; None when it signs in none."""
    if session_key is None:
        return None
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    try:
        user_id, backend_path = session[SESSION_KEY], session[BACKEND_SESSION_KEY]
    except KeyError:  # signed out, or the session expired
        return None
    if backend_path not in settings.AUTHENTICATION_BACKENDS:
        return None
    user = load_backend(backend_path).get_user(get_user_model()._meta.pk.to_python(user_id))  # None when inactive
    if user is None or not constant_time_compare(session.get(HASH_SESSION_KEY, ""), user.get_session_auth_hash()):
        return None
    return user


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


class _Subscriber:
    """The Redis client and pub/sub connection of the streams an event loop serves (see the module note)."""

    def __init__(self, url: str):
        self.client = aioredis.Redis.from_url(url, socket_connect_timeout=REDIS_CONNECT_TIMEOUT_SECONDS)
        self.streams = 0
        self._pubsub = self.client.pubsub()
        self._queues: dict[bytes, set[asyncio.Queue]] = {}  # channel -> its streams' queues
        self._lock = asyncio.Lock()  # (un)subscribing a channel and registering its queues are one step
        self._reader: asyncio.Task | None = None

    async def subscribe(self, channel: str) -> asyncio.Queue:
        """A queue of the channel's messages (their data), then of the error that ends them if one does
        (the shared connection failed, or ``FellBehind``); the channel is subscribed when this returns."""
        key, messages = channel.encode(), asyncio.Queue(maxsize=SUBSCRIPTION_QUEUE_MESSAGES)
        async with self._lock:
            if key not in self._queues:
                await self._pubsub.subscribe(key)
                self._queues[key] = set()
            self._queues[key].add(messages)
            if self._reader is None or self._reader.done():  # the first stream, or the first since a failure
                self._reader = asyncio.create_task(self._read())
        return messages

    async def unsubscribe(self, channel: str, messages: asyncio.Queue) -> None:
        key = channel.encode()
        async with self._lock:
            queues = self._queues.get(key, set())
            queues.discard(messages)
            if not queues and self._queues.pop(key, None) is not None:
                await self._pubsub.unsubscribe(key)

    async def _read(self) -> None:
        """Hands every message to its channel's queues until the connection fails (redis-py has tried to
        reconnect by then), then the error to every queue: their streams end, and a later stream's
        ``subscribe`` starts reading again."""
        try:
            while True:
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
                if message is not None:
                    for messages in tuple(self._queues.get(message["channel"], ())):
                        self._hand_over(message["channel"], messages, message["data"])
        except (aioredis.RedisError, OSError) as error:
            self._end_every_stream(error)
        except Exception as error:  # a stream waiting for a reader that died would wait for ever
            logger.exception("the live streams' Redis subscription failed")
            self._end_every_stream(aioredis.ConnectionError(f"the subscription failed: {error!r}"))

    def _end_every_stream(self, error: Exception) -> None:
        for queues in self._queues.values():
            for messages in queues:
                _end(messages, error)

    def _hand_over(self, channel: bytes, messages: asyncio.Queue, data: bytes) -> None:
        try:
            messages.put_nowait(data)
        except asyncio.QueueFull:
            self._queues[channel].discard(messages)
            _end(messages, FellBehind(f"{SUBSCRIPTION_QUEUE_MESSAGES} messages not taken"))

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        with contextlib.suppress(aioredis.RedisError, OSError):
            await self._pubsub.aclose()
        with contextlib.suppress(aioredis.RedisError, OSError):
            await self.client.aclose()


def _end(messages: asyncio.Queue, error: Exception) -> None:
    """Make ``error`` the next thing a stream takes from its queue (what is left in it is dropped)."""
    while not messages.empty():
        messages.get_nowait()
    messages.put_nowait(error)


# (event loop, Redis URL) -> the subscriber of the streams the loop serves now
_subscribers: dict[tuple[asyncio.AbstractEventLoop, str], _Subscriber] = {}


@contextlib.asynccontextmanager
async def _subscriber() -> AsyncIterator[_Subscriber]:
    """This event loop's subscriber, made for the first of its streams and closed after the last."""
    key = (asyncio.get_running_loop(), settings.REDIS_URL)
    subscriber = _subscribers.get(key)
    if subscriber is None:
        subscriber = _subscribers[key] = _Subscriber(settings.REDIS_URL)
    subscriber.streams += 1
    try:
        yield subscriber
    finally:
        subscriber.streams -= 1
        if not subscriber.streams:
            del _subscribers[key]  # before the await: a stream starting meanwhile makes a new one
            await subscriber.close()


async def relay_channel(channel: str, *, is_terminal: Callable[[dict], bool], max_seconds: float,
                        backlog_key: str | None = None, opening: tuple[str, ...] = (),
                        access_lost: AccessLost | None = None, label: str) -> AsyncIterator[str]:
    """SSE messages of the JSON events published on ``channel`` (see the module note).

    ``opening`` is sent once the channel is subscribed: a page that catches up when it reads it
    misses nothing published after its catch-up. ``backlog_key`` names a Redis list of the events
    published so far, each with a ``seq``. When Redis is unreachable, or the client reads too little
    (``FellBehind``), the stream sends ``{"type": "unavailable"}`` and ends; ``label`` names the stream
    in that log line. ``access_lost()`` (``session_access_lost``'s) is asked every ``ACCESS_RECHECK_SECONDS``: once
    it is true (the client left the project or was signed out, the object was deleted) the stream ends, forwarding
    nothing more, and the browser's reconnection meets the 404 (or the login page) any other request of it would.
    """
    async with _subscriber() as subscriber:
        messages: asyncio.Queue | None = None
        try:
            messages = await subscriber.subscribe(channel)
            for message in opening:
                yield message
            last_seq = -1
            if backlog_key is not None:
                for raw in await subscriber.client.lrange(backlog_key, 0, -1):
                    event = json.loads(raw)
                    last_seq = event.get("seq", last_seq)
                    yield sse_message(event)
                    if is_terminal(event):
                        return
            deadline = time.monotonic() + max_seconds
            last_sent = last_checked = time.monotonic()
            while time.monotonic() < deadline:
                try:
                    async with asyncio.timeout(1.0):
                        data = await messages.get()
                except TimeoutError:
                    data = None
                # Asked between an event's arrival and its forwarding: none goes to a client refused since.
                if access_lost is not None and time.monotonic() - last_checked >= ACCESS_RECHECK_SECONDS:
                    if await access_lost():
                        return
                    last_checked = time.monotonic()
                if data is None:
                    if time.monotonic() - last_sent > KEEPALIVE_SECONDS:
                        yield ": keepalive\n\n"
                        last_sent = time.monotonic()
                    continue
                if isinstance(data, Exception):
                    raise data
                event = json.loads(data)
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
        except FellBehind as error:
            logger.warning("%s: live stream stopped, its client fell behind: %s", label, error)
            yield sse_message({"type": "unavailable"})
        finally:
            if messages is not None:
                with contextlib.suppress(aioredis.RedisError, OSError):
                    await subscriber.unsubscribe(channel, messages)
