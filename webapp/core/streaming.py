"""Large downloads sent a chunk at a time (a dataset file, a model's tar: gigabytes).

Temper is served by uvicorn, and Django's ASGI handler reads a response's synchronous iterator whole
into a list before it sends a byte (``FileResponse`` included): a 2 GB file would sit in the web process.
An asynchronous iterator is sent as it is read, so downloads are handed over as one (``asynchronous``),
each chunk read in a worker thread.

A download does not outlive its client's right to it: every ``sse.ACCESS_RECHECK_SECONDS``, as the live
streams, it asks ``access_lost`` (``sse.session_access_lost`` for the pages', the REST API's token for its own)
and, once the client may no longer read it, ends there, logging one line: which download, whose, after how many
bytes, and why. The client must see an unfinished transfer, not a shorter file: so the response is left without
its closing message (``LeaveCutDownloadsUnfinished``, around the ASGI application) and uvicorn closes the
connection, before the file's Content-Length or a tar's last chunk. Sent, that message made uvicorn log an error
with h11's traceback ('Too little data for declared Content-Length'), and ended a tar's chunked body as if whole;
left out, uvicorn logs 'ASGI callable returned without completing response.', which ``QuietAboutCutDownloads``
drops for the responses Temper cut on purpose (and only those: an unfinished response of any other cause is still
logged).
"""
from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar
from pathlib import Path

from asgiref.sync import sync_to_async
from django.http import HttpRequest, StreamingHttpResponse
from django.utils.http import content_disposition_header

from webapp.core import sse

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20  # read from a file and sent at a time

# uvicorn's log line (every HTTP protocol of it) for an application that returns before its response's last message.
UVICORN_UNFINISHED = "ASGI callable returned without completing response."


class _Response:
    """Whether Temper cut the response of one ASGI call short on purpose."""

    cut = False


# Set by ``LeaveCutDownloadsUnfinished`` in uvicorn's task for the request, the one that logs its end: Django's
# handler runs the response in tasks of its own, which see the same ``_Response``.
_this_response: ContextVar[_Response | None] = ContextVar("temper_download_response", default=None)


def download_label(request: HttpRequest) -> str:
    """A download as its cut's log line names it: the request and its account."""
    return f"{request.method} {request.path} by {request.user.get_username()}"


async def asynchronous(chunks: Iterator[bytes], *, access_lost: sse.AccessLost | None = None, label: str = ""
                       ) -> AsyncIterator[bytes]:
    """``chunks``, each read in a worker thread (file reads, no database), for Django's ASGI handler to
    send as they come; ended unfinished once ``access_lost()``, asked every ``sse.ACCESS_RECHECK_SECONDS``, says
    why, with a line in the log naming ``label`` (see the module note)."""
    read = sync_to_async(next, thread_sensitive=False)
    last_checked = time.monotonic()
    sent = 0
    while (chunk := await read(chunks, None)) is not None:
        if access_lost is not None and time.monotonic() - last_checked >= sse.ACCESS_RECHECK_SECONDS:
            if why := await access_lost():
                if (response := _this_response.get()) is not None:
                    response.cut = True
                logger.warning("%s: download cut short after %s bytes, as its client may no longer read it: %s",
                               label, f"{sent:,}", why)
                return
            last_checked = time.monotonic()
        sent += len(chunk)
        yield chunk


class LeaveCutDownloadsUnfinished:
    """ASGI middleware, outermost: the closing message of a response ``asynchronous`` cut is not passed on, so that
    uvicorn closes the connection with the transfer unfinished (see the module note)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        response = _Response()
        _this_response.set(response)  # left set: uvicorn's log line comes after this call returns, in its context

        async def send_unless_cut(message) -> None:
            if response.cut and message["type"] == "http.response.body" and not message.get("more_body", False):
                return
            await send(message)

        await self.app(scope, receive, send_unless_cut)


class QuietAboutCutDownloads(logging.Filter):
    """On uvicorn's ``uvicorn.error`` logger: drops its ``UVICORN_UNFINISHED`` line for a response Temper cut on
    purpose, which ``asynchronous`` has logged in its own words."""

    def filter(self, record: logging.LogRecord) -> bool:
        response = _this_response.get()
        return not (record.msg == UVICORN_UNFINISHED and response is not None and response.cut)


def file_chunks(path: Path) -> Iterator[bytes]:
    """The bytes of ``path``, ``CHUNK_BYTES`` at a time; the file is closed when the stream ends or is dropped."""
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            yield chunk


def file_download(path: Path, *, filename: str, access_lost: sse.AccessLost, label: str,
                  content_type: str = "application/octet-stream") -> StreamingHttpResponse:
    """``path`` as an attachment named ``filename``, streamed (``FileResponse``'s headers, without its
    whole-file read under ASGI) while ``access_lost()`` says nothing; ``label`` (``download_label``) names it."""
    response = StreamingHttpResponse(asynchronous(file_chunks(path), access_lost=access_lost, label=label),
                                     content_type=content_type)
    response["Content-Length"] = str(path.stat().st_size)
    response["Content-Disposition"] = content_disposition_header(True, filename)
    return response
