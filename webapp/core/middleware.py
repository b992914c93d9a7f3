"""The base of Temper's own middleware: one class that Django runs in the event loop under ASGI (uvicorn)
and plainly under WSGI (the test client), so that no request crosses to a thread and back for it."""
from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse


class DualModeMiddleware:
    """Subclasses write ``call`` (sync) and ``acall`` (async); Django picks the mode of the chain."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        return self.acall(request) if self.is_async else self.call(request)

    def call(self, request: HttpRequest) -> HttpResponse:
        raise NotImplementedError

    async def acall(self, request: HttpRequest) -> HttpResponse:
        raise NotImplementedError
