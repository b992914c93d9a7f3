"""Large downloads sent a chunk at a time (a dataset file, a model's tar: gigabytes).

Temper is served by uvicorn, and Django's ASGI handler reads a response's synchronous iterator whole
into a list before it sends a byte (``FileResponse`` included): a 2 GB file would sit in the web process.
An asynchronous iterator is sent as it is read, so downloads are handed over as one (``asynchronous``),
each chunk read in a worker thread.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse
from django.utils.http import content_disposition_header

CHUNK_BYTES = 1 << 20  # read from a file and sent at a time


async def asynchronous(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks``, each read in a worker thread (file reads, no database), for Django's ASGI handler to
    send as they come."""
    read = sync_to_async(next, thread_sensitive=False)
    while (chunk := await read(chunks, None)) is not None:
        yield chunk


def file_chunks(path: Path) -> Iterator[bytes]:
    """The bytes of ``path``, ``CHUNK_BYTES`` at a time; the file is closed when the stream ends or is dropped."""
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            yield chunk


def file_download(path: Path, *, filename: str, content_type: str = "application/octet-stream"
                  ) -> StreamingHttpResponse:
    """``path`` as an attachment named ``filename``, streamed (``FileResponse``'s headers, without its
    whole-file read under ASGI)."""
    response = StreamingHttpResponse(asynchronous(file_chunks(path)), content_type=content_type)
    response["Content-Length"] = str(path.stat().st_size)
    response["Content-Disposition"] = content_disposition_header(True, filename)
    return response
