"""Hand a streamed response's database connection back before the stream, not after it.

A request's database connection is closed (on PostgreSQL: returned to the process's pool, see
settings.py) when the request finishes, and a streamed response finishes when its last byte is sent: a
token stream, a run's live events or a large download held a connection for minutes, doing nothing with
it, and enough of them at once would leave the pool none for anyone else. ``ReleaseDatabaseForStreams``
closes the request's connections as soon as the view has made a streamed response (what the stream
does with the database later opens a connection of its own, closed at the end as before).

It comes first in ``MIDDLEWARE`` (after the metrics' timer), so that the other middleware has done its
own database work on the response (the session's save) by then. A connection inside a transaction is
left alone: closing it would roll the transaction back (the test suite runs each test in one).
"""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import connections
from django.http import HttpRequest, HttpResponse

from webapp.core.middleware import DualModeMiddleware


def release_connections() -> None:
    """Close this thread's database connections that Django would close at the request's end."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


class ReleaseDatabaseForStreams(DualModeMiddleware):
    def call(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.streaming:
            release_connections()
        return response

    async def acall(self, request: HttpRequest) -> HttpResponse:
        response = await self.get_response(request)
        if response.streaming:
            # In the request's own thread (asgiref's thread-sensitive executor), where its ORM work ran.
            await sync_to_async(release_connections)()
        return response
