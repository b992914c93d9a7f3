"""Django's ASGI handler, with a body sent without a ``Content-Length`` read as sent.

Design note: a client may send a body chunked (HTTP/1.1 ``Transfer-Encoding: chunked``: curl -H 'Transfer-Encoding:
chunked', a library streaming a file it has not measured) or, over HTTP/2, with no length at all. Django's ASGI
handler receives such a body whole, spooled to a temporary file, but its multipart parser reads ``CONTENT_LENGTH``
bytes, none without the header: an upload reached its view with no fields and no file, and the client was told to
attach the file it had attached. ``MeasuredBodyRequest`` gives such a request the length of what was received. The
body is bounded as one with a length is: ``datasets.uploads.RequestBodyLimit``, in front of this handler, counts a
body without a length as it arrives and refuses it (413) past the same limits, before the view runs.
"""
from __future__ import annotations

import os

from django.core.handlers.asgi import ASGIHandler, ASGIRequest


class MeasuredBodyRequest(ASGIRequest):
    """An ``ASGIRequest`` whose ``CONTENT_LENGTH``, when the client sent none, is the size of the body received."""

    def __init__(self, scope, body_file):
        super().__init__(scope, body_file)
        if "CONTENT_LENGTH" not in self.META:
            size = body_file.seek(0, os.SEEK_END)
            body_file.seek(0)
            if size:
                self.META["CONTENT_LENGTH"] = str(size)


class MeasuredBodyASGIHandler(ASGIHandler):
    """The ASGI handler uvicorn runs (``webapp.asgi``): Django's, with ``MeasuredBodyRequest``."""

    request_class = MeasuredBodyRequest
