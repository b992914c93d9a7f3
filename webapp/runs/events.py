"""Server-sent events of one run: an async view that relays the run's Redis channel.

Each connection subscribes with ``redis.asyncio`` and forwards every published event as one SSE
message (``data: <json>``), with a comment line every ``KEEPALIVE_SECONDS`` so proxies keep the
connection open. A stream ends after ``MAX_STREAM_SECONDS`` (the browser's EventSource reconnects
by itself) or once the run has finished; a finished run's stream stays open while a checkpoint of
it is being exported, until the event of the last such export. Its first message, the hello, comes
once the channel is subscribed: the page then fills any gap (what was published before) from the
JSON endpoint, and falls back to polling it when server-sent events do not get through.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, StreamingHttpResponse

from webapp.core.sse import event_stream_response, relay_channel, session_access_lost, sse_message
from webapp.runs import channels
from webapp.runs.access import get_run_for_user
from webapp.runs.models import CheckpointExportStatus

MAX_STREAM_SECONDS = 600.0
TERMINAL = {"succeeded", "failed", "cancelled"}


def _is_terminal(event: dict) -> bool:
    return event.get("type") == "status" and event.get("status") in TERMINAL


def _ends_exports(event: dict) -> bool:
    """The event of a checkpoint export after which none of the run's is still running."""
    return event.get("type") == "checkpoint" and not event.get("exporting")


async def _relay(public_id: str, status: str, *, exporting: bool,
                 access_lost: Callable[[], Awaitable[bool]]) -> AsyncIterator[str]:
    # The page goes live and catches up on the hello, so it comes once the channel is subscribed:
    # sent before, an event published between the page's catch-up and the subscription was lost.
    hello = ("retry: 2000\n\n", sse_message({"type": "hello", "status": status}))
    if status in TERMINAL and not exporting:
        for message in hello:
            yield message
        return
    is_terminal = _ends_exports if status in TERMINAL else _is_terminal
    async for message in relay_channel(channels.events_channel(public_id), is_terminal=is_terminal,
                                       max_seconds=MAX_STREAM_SECONDS, opening=hello, access_lost=access_lost,
                                       label=f"run {public_id}"):
        yield message


@login_required
async def run_events(request: HttpRequest, slug: str, run_id: str) -> StreamingHttpResponse:
    """``text/event-stream`` of the run's live events (see the module notes)."""
    user = await request.auser()
    _project, _membership, run = await sync_to_async(get_run_for_user)(user, slug, run_id)
    exporting = await run.checkpoint_exports.filter(status=CheckpointExportStatus.EXPORTING).aexists()
    access_lost = session_access_lost(request, lambda account: get_run_for_user(account, slug, run_id))
    return event_stream_response(request, _relay(run.public_id, run.status, exporting=exporting,
                                                  access_lost=access_lost))
