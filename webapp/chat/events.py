"""Server-sent events of one answer: an async view relaying the generation's Redis events.

The view subscribes to the generation's channel first, then reads the events stored so far, then
forwards channel events whose ``seq`` is past the last one sent (``webapp.chat.channels``), so a
page that connects late still gets every token once. The stream ends with the ``done`` or ``error``
event, or after ``MAX_STREAM_SECONDS``. An answer already finished in the database is sent as one
``done`` event without touching Redis; one that no worker will finish (``services.answer_is_lost``) is
failed first and sent as its ``error`` event, and one that becomes so while its stream is open (its serve worker
died) is failed at the stream's next recheck (``sse.ACCESS_RECHECK_SECONDS``), whose error event the stream relays.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, StreamingHttpResponse

from webapp.core.sse import event_stream_response, relay_channel, session_access_lost, sse_message
from webapp.chat import channels, services
from webapp.chat.access import get_message_for_user
from webapp.chat.models import MessageStatus

MAX_STREAM_SECONDS = 300.0
FINISH_REASON = {MessageStatus.COMPLETE: "stop", MessageStatus.STOPPED: "cancelled", MessageStatus.TIMEOUT: "timeout"}


def relay(generation_id: str, *, access_lost: Callable[[], Awaitable[bool]] | None = None,
          max_seconds: float = MAX_STREAM_SECONDS) -> AsyncIterator[str]:
    """SSE lines of one generation's events until its terminal event, or for ``max_seconds`` (see the module note)."""
    return relay_channel(channels.channel(generation_id), backlog_key=channels.events_key(generation_id),
                         is_terminal=lambda event: event["type"] in channels.TERMINAL_TYPES,
                         max_seconds=max_seconds, access_lost=access_lost, label=f"generation {generation_id}")


async def _finished(message) -> AsyncIterator[str]:
    if message.status == MessageStatus.FAILED:
        yield sse_message({"seq": 0, "type": "error", "message": message.error})
    else:
        yield sse_message({"seq": 0, "type": "done", "text": message.content,
                           "finish_reason": FINISH_REASON[message.status],
                           "completion_tokens": message.completion_tokens})


@login_required
async def message_events(request: HttpRequest, slug: str, conversation_id: str, message_id: str
                         ) -> StreamingHttpResponse:
    """``text/event-stream`` of an answer's events."""
    user = await request.auser()
    _project, _conversation, message = await sync_to_async(get_message_for_user)(
        user, slug, conversation_id, message_id)
    # A page left open on an answer no worker will finish reconnects here when each stream ends: fail
    # the answer then, so that the page ends (an arena battle has no Stop, and waited for ever to vote).
    if message.status == MessageStatus.STREAMING and await sync_to_async(services.message_give_up_if_lost)(
            message=message):
        await sync_to_async(message.refresh_from_db)()
    access_lost = session_access_lost(
        request, lambda account: get_message_for_user(account, slug, conversation_id, message_id))

    async def access_lost_or_answer_given_up() -> bool:
        # An answer whose serve worker died is given up at the stream's next recheck, not at its reconnection
        # minutes later: its error event goes out on the channel, which this stream relays and ends on.
        if await access_lost():
            return True
        await sync_to_async(services.message_give_up_if_lost)(message=message)
        return False

    stream = (relay(message.public_id, access_lost=access_lost_or_answer_given_up)
              if message.status == MessageStatus.STREAMING else _finished(message))
    return event_stream_response(request, stream)
