"""Large downloads sent a chunk at a time (a dataset file, a model's tar: gigabytes).

Temper is served by uvicorn, and Django's ASGI handler reads a response's synchronous iterator whole
into a list before it sends a byte (``FileResponse`` included): a 2 GB file would sit in the web process.
An asynchronous iterator is sent as it is read, so downloads are handed over as one (``asynchronous``),
each chunk read in a worker thread.

A download does not outlive its client's right to it: every ``sse.ACCESS_RECHECK_SECONDS``, as the live
streams, it asks ``access_lost`` (``sse.session_access_lost`` for the pages', the REST API's token for its own)
and, once the client may no longer read it, ends there. The client gets an unfinished file (fewer bytes than
its Content-Length, a tar without its end), which browsers and HTTP clients report as failed; uvicorn logs a
response shorter than its Content-Length as an error and closes the connection.
"""
from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse
from django.utils.http import content_disposition_header

from webapp.core import sse

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20  # read from a file and sent at a time


async def asynchronous(chunks: Iterator[bytes], *, access_lost: Callable[[], Awaitable[bool]] | None = None
                       ) -> AsyncIterator[bytes]:
    """``chunks``, each read in a worker thread (file reads, no database), for Django's ASGI handler to
    send as they come; ended early once ``access_lost()``, asked every ``sse.ACCESS_RECHECK_SECONDS``, is true
    (see the module note)."""
    read = sync_to_async(next, thread_sensitive=False)
    last_checked = time.monotonic()
    while (chunk := await read(chunks, None)) is not None:
        if access_lost is not None and time.monotonic() - last_checked >= sse.ACCESS_RECHECK_SECONDS:
            if await access_lost():
                logger.warning("a download stopped unfinished: its client may no longer read it")
                return
            last_checked = time.monotonic()
        yield chunk


def file_chunks(path: Path) -> Iterator[bytes]:
    """The bytes of ``path``, ``CHUNK_BYTES`` at a time; the file is closed when the stream ends or is dropped."""
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            yield chunk


def file_download(path: Path, *, filename: str, access_lost: Callable[[], Awaitable[bool]],
                  content_type: str = "application/octet-stream") -> StreamingHttpResponse:
    """``path`` as an attachment named ``filename``, streamed (``FileResponse``'s headers, without its
    whole-file read under ASGI) while ``access_lost()`` is not true."""
    response = StreamingHttpResponse(asynchronous(file_chunks(path), access_lost=access_lost),
                                     content_type=content_type)
    response["Content-Length"] = str(path.stat().st_size)
    response["Content-Disposition"] = content_disposition_header(True, filename)
    return response
