"""Django's ASGI handler, with a body sent without a ``Content-Length`` read as sent.

Design note: a client may send a body chunked (HTTP/1.1 ``Transfer-Encoding: chunked``: curl -H 'Transfer-Encoding:
chunked', a library streaming a file it has not measured) or, over HTTP/2, with no length at all. Django's ASGI
handler receives such a body whole, spooled to a temporary file, but its multipart parser reads ``CONTENT_LENGTH``
bytes, none without the header: an upload reached its view with no fields and no file, and the client was told to
attach the file it had attached. ``MeasuredBodyRequest`` gives such a request the length of what was received. The
body is bounded as one with a length is: ``datasets.uploads.RequestBodyLimit``, in front of this handler, counts a
body without a length as it arrives and refuses it (413) past the same limits, before the view runs.

A body that stops before its ``Content-Length`` (the client disconnects, or only stops sending and shuts its side)
never reaches a view: uvicorn reports the closed connection as ``http.disconnect``, and Django's handler drops the
request, closing (so deleting) the file it was spooling the body to; there is no one left to answer. What does reach
a view is a body complete to its length that ends inside a multipart file (the client's length was that of what it
sent): the upload views say so (``datasets.uploads.LimitedUploadHandler.cut_short``).
"""
from __future__ import annotations

import os
import tempfile

from django.core.handlers.asgi import ASGIHandler, ASGIRequest

from webapp.core.disk_free import disk_full_message, is_disk_full


class BodyNotSpooled(Exception):
    """The disk filled as a request's body was spooled to its temporary file (``MeasuredBodyASGIHandler.read_body``),
    before any view ran: the message says so, for the guard in front (``datasets.uploads.RequestBodyLimit``) to answer
    507. The file has no name on disk (a ``TemporaryFile``): nothing half-written is left."""


class MeasuredBodyRequest(ASGIRequest):
    """An ``ASGIRequest`` whose ``CONTENT_LENGTH``, when the client sent none, is the size of the body received;
    ``body_received`` is that size, with a length or without (an upload that ends inside its file says it:
    ``datasets.uploads.upload_cut_short_message``)."""

    def __init__(self, scope, body_file):
        super().__init__(scope, body_file)
        self.body_received = body_file.seek(0, os.SEEK_END)
        body_file.seek(0)
        if "CONTENT_LENGTH" not in self.META and self.body_received:
            self.META["CONTENT_LENGTH"] = str(self.body_received)


class MeasuredBodyASGIHandler(ASGIHandler):
    """The ASGI handler uvicorn runs (``webapp.asgi``): Django's, with ``MeasuredBodyRequest``."""

    request_class = MeasuredBodyRequest

    async def read_body(self, receive):
        try:
            return await super().read_body(receive)
        except OSError as error:
            if not is_disk_full(error):
                raise
            raise BodyNotSpooled(disk_full_message(tempfile.gettempdir())) from None
