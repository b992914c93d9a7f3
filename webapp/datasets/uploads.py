"""Streaming uploads with a size limit, and atomic placement of the stored file.

Django already streams a multipart upload to a temporary file once it passes
``FILE_UPLOAD_MAX_MEMORY_SIZE``; ``LimitedUploadHandler`` adds the limit while the bytes arrive,
so an oversize file is dropped part-way instead of being written out in full. A request whose
``Content-Length`` alone is over the limit is refused before its body is read
(``body_too_large``, used by the upload view and by the ASGI guard in ``webapp.asgi``).
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from types import SimpleNamespace

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import StopUpload, TemporaryFileUploadHandler
from django.db import connections
from django.template.defaultfilters import filesizeformat
from django.http.cookie import parse_cookie

from jaxengine.data.formats import TOO_LARGE_REMEDY
from webapp.api.services import token_authenticate
from webapp.core.asgi_requests import BodyNotSpooled
from webapp.core.disk_free import disk_full_message, is_disk_full, upload_room_refusal
from webapp.core.middleware import security_headers
from webapp.core.views import json_api_at
from webapp.projects.models import Membership, Role, role_at_least

# Room for the multipart framing and the form's other fields around the file itself.
MULTIPART_OVERHEAD_BYTES = 1024 * 1024


def one_file_per_upload_message(count: int) -> str:
    """The refusal of ``count`` files sent under one upload's file field, on the web form and in the API: the
    multipart parser keeps the last of them, and the others would be dropped without a word."""
    return f"{count} files were sent: send one file per upload (upload each as a version of its own)"


def name_as_uploaded(sent_name: str) -> str:
    """The name of an uploaded file (a dataset's file, a base model's archive) as it was on the sender's disk:
    browsers send a '"' in it as %22 (the HTML standard's escape inside multipart's ``filename="..."``), and Django
    keeps the name as sent, so pages and downloads showed ``my %22best%22.jsonl``. Read where a multipart name is
    taken, not of a name given otherwise (a file on the server may hold %22). %0A and %0D (line breaks, escaped alike) stay as sent: a name
    holding a line break cannot go into a download's Content-Disposition header."""
    return sent_name.replace("%22", '"')


def body_too_large(content_length: str | int | None, *, max_upload_bytes: int) -> bool:
    """True when a request body of ``content_length`` cannot hold a file within the limit."""
    try:
        length = int(content_length or 0)
    except (TypeError, ValueError):
        return False
    return length > max_upload_bytes + MULTIPART_OVERHEAD_BYTES


def file_too_large_message(limit: int) -> str:
    """The refusal of a dataset file past ``TEMPER_MAX_UPLOAD_BYTES`` as it arrives, on the page and in the API."""
    return f"the file is over the {filesizeformat(limit)} upload limit; {TOO_LARGE_REMEDY}"


@dataclass(frozen=True, kw_only=True)
class CutShort:
    """A multipart body that ended inside a file: ``file_bytes`` of ``file_name`` had come; the body held
    ``body_bytes`` of the ``announced_bytes`` its Content-Length announced (None where the server does not say)."""
    file_name: str
    file_bytes: int
    body_bytes: int | None
    announced_bytes: int | None


def upload_cut_short_message(cut: CutShort) -> str:
    """The refusal of an upload whose body ended before its file did, on the pages and in the API: it was no
    missing field (Django's parser drops the unfinished file, and the view was left to ask for it)."""
    if cut.body_bytes is not None and cut.announced_bytes is not None and cut.body_bytes < cut.announced_bytes:
        arrived = f"{cut.body_bytes:,} bytes of the {cut.announced_bytes:,} the request announced arrived"
    else:
        arrived = (f"{cut.file_bytes:,} bytes of it arrived, then the request's body ended with no closing multipart "
                   "boundary (the client stopped sending, or sent the length of what it had)")
    return f"the upload ended before {cut.file_name} was complete: {arrived}; nothing was saved: send it again"


class LimitedUploadHandler(TemporaryFileUploadHandler):
    """Streams each file to a temporary file and stops the upload once a file passes ``max_bytes``.

    After parsing, ``exceeded`` tells the view that a file was dropped for its size, ``cut_short`` that the body
    ended inside a file (Django's parser drops that file and deletes its temporary file, without a word), and
    ``disk_full`` (its message) that the disk filled as the file was written: the file is dropped the same way.
    """

    def __init__(self, request=None, *, max_bytes: int):
        super().__init__(request)
        self.max_bytes = max_bytes
        self.exceeded = False
        self.disk_full = ""
        self.cut_short: CutShort | None = None
        self._received = 0
        self._announced: int | None = None

    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None) -> None:
        self._announced = content_length
        return super().handle_raw_input(input_data, META, content_length, boundary, encoding)

    def upload_interrupted(self) -> None:
        # Called by the parser when the body ends before the file being received does.
        self.cut_short = CutShort(file_name=self.file_name, file_bytes=self._received,
                                  body_bytes=getattr(self.request, "body_received", None),
                                  announced_bytes=self._announced)
        super().upload_interrupted()

    def new_file(self, *args, **kwargs) -> None:
        self._received = 0
        super().new_file(*args, **kwargs)

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self._received += len(raw_data)
        if self._received > self.max_bytes:
            self.exceeded = True
            # Drain the (small) rest of the body so the client gets our answer, not a reset.
            raise StopUpload(connection_reset=False)
        try:
            return super().receive_data_chunk(raw_data, start)
        except OSError as error:
            if not is_disk_full(error):
                raise
            # The parser closes the temporary file on StopUpload, which deletes it: nothing half-written is left.
            self.disk_full = disk_full_message(Path(self.file.temporary_file_path()).parent)
            raise StopUpload(connection_reset=False) from None


def store_upload(upload: UploadedFile, destination: Path) -> int:
    """Move or copy ``upload`` to ``destination`` atomically; returns its size in bytes.

    The bytes land in a temporary file in the destination directory first and are renamed into
    place, so a reader never sees a half-written file. A disk that fills as they are copied (from a temporary file
    on another filesystem) leaves no part behind and is a ``ValidationError`` on ``file`` saying so.
    """
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.", suffix=".part")
    except OSError as error:
        raise _disk_full_refusal(error, destination) from None
    os.close(handle)
    try:
        temporary_path = getattr(upload, "temporary_file_path", None)
        if temporary_path is not None:
            shutil.move(temporary_path(), partial)
        else:
            with open(partial, "wb") as out:
                for chunk in upload.chunks():
                    out.write(chunk)
        os.replace(partial, destination)
    except BaseException as error:
        Path(partial).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise _disk_full_refusal(error, destination) from None
        raise
    return destination.stat().st_size


def _disk_full_refusal(error: OSError, destination: Path) -> Exception:
    """``error`` as a person reads it when the disk is full; ``error`` itself otherwise."""
    if not is_disk_full(error):
        return error
    return ValidationError({"file": disk_full_message(destination.parent)})


class RequestBodyLimit:
    """ASGI middleware: answer 413 to a request whose ``Content-Length`` is over the upload limit,
    before its body is received, and to one sent without a length (chunked) once it passes the limit.
    Django's ASGI handler reads a whole body (spooling it to disk) before any view or login check runs,
    so only this layer can refuse it without reading it."""

    # The addresses that take a dataset file: the web form's two and the REST API's. Every other address takes
    # forms and JSON of at most ``max_other_bytes`` (DATA_UPLOAD_MAX_MEMORY_SIZE): at the upload limit, anyone
    # could have Django spool gigabytes to disk at the login page, many requests at a time. The upload addresses
    # take more only from a sender who may upload there (``may_upload``), for the same reason.
    UPLOAD_PATHS = re.compile(r"/p/(?P<page>[^/]+)/datasets/(?:new|[^/]+/upload)/|/api/v1/projects/(?P<api>[^/]+)/datasets/")
    # The base models' upload page (``basemodels.views.basemodel_upload``) and the REST API's ``POST base-models/``: a
    # model's archive, up to ``max_model_upload_bytes``, from an owner of the project only.
    MODEL_UPLOAD_PATH = re.compile(r"/p/(?P<page>[^/]+)/models/upload/|/api/v1/projects/(?P<api>[^/]+)/base-models/")

    def __init__(self, app, *, max_upload_bytes: int, max_other_bytes: int | None = None,
                 max_model_upload_bytes: int | None = None):
        self.app = app
        self.upload_bytes = max_upload_bytes
        self.other_bytes = max_upload_bytes if max_other_bytes is None else max_other_bytes
        self.model_upload_bytes = max_upload_bytes if max_model_upload_bytes is None else max_model_upload_bytes

    async def _limit(self, scope, headers: dict[bytes, bytes]) -> tuple[int, str]:
        """The most bytes ``scope``'s body may hold, and the refusal's reason past it: "upload" at an upload address
        from a sender who may upload there ("model" at the model upload page), "sender" there from anyone else
        ("model sender"), "other" elsewhere."""
        path = scope.get("path", "")
        if (model := self.MODEL_UPLOAD_PATH.fullmatch(path)) is not None:
            limit, role, reasons, slug, api = (self.model_upload_bytes, Role.OWNER, ("model", "model sender"),
                                               model["page"] or model["api"], model["api"] is not None)
        elif (upload := self.UPLOAD_PATHS.fullmatch(path)) is not None:
            limit, role, reasons, slug, api = (self.upload_bytes, Role.MEMBER, ("upload", "sender"),
                                               upload["page"] or upload["api"], upload["api"] is not None)
        else:
            return self.other_bytes, "other"
        if self.other_bytes >= limit:
            return limit, reasons[0]
        allowed = await sync_to_async(may_upload, thread_sensitive=False)(headers, slug=slug, api=api, role=role)
        return (limit, reasons[0]) if allowed else (self.other_bytes, reasons[1])

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:  # the server holds the body to it
            # A body that every address takes needs no question of who sends it (no database read).
            if body_too_large(length.decode("latin-1"), max_upload_bytes=self.other_bytes):
                limit, reason = await self._limit(scope, headers)
                if body_too_large(length.decode("latin-1"), max_upload_bytes=limit):
                    await self._refuse(scope, send, reason)
                    return
                # Said to a sender who may upload here only: the server's free space is none of anyone else's.
                if reason in ("upload", "model") and (no_room := upload_room_refusal(
                        length.decode("latin-1"), destination=settings.MODELS_ROOT if reason == "model"
                        else settings.DATA_ROOT, unpacked=reason == "model")):
                    await self._refuse(scope, send, reason, message=no_room, status=507)
                    return
            await self._spooled(scope, receive, send)
            return
        await self._counted(scope, receive, send, headers)

    async def _spooled(self, scope, receive, send):
        """The app, answering 507 where the disk filled as it spooled the body (before it answered anything)."""
        try:
            await self.app(scope, receive, send)
        except BodyNotSpooled as error:
            await self._refuse(scope, send, "", message=str(error), status=507)

    async def _counted(self, scope, receive, send, headers: dict[bytes, bytes]):
        """A body without a length (``Transfer-Encoding: chunked``), counted as it arrives: past the limit the
        app is told the client went away (Django drops the request it was reading) and the client gets 413.
        Who sends it is asked only once it passes what every address takes (most such requests have no body)."""
        received, over, started = 0, False, False
        limit, reason = self.other_bytes, "other"
        asked = False

        async def counted_receive():
            nonlocal received, over, limit, reason, asked
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if body_too_large(received, max_upload_bytes=limit) and not asked:
                    asked = True
                    limit, reason = await self._limit(scope, headers)
                if body_too_large(received, max_upload_bytes=limit):
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self._spooled(scope, counted_receive, tracked_send)
        if over and not started:
            await self._refuse(scope, send, reason)

    async def _refuse(self, scope, send, reason: str, *, message: str = "", status: int = 413) -> None:
        content_type, body = self._refusal(scope.get("path", ""), reason, message=message)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close"), *security_headers(scope)]})
        await send({"type": "http.response.body", "body": body})

    def _refusal(self, path: str, reason: str, *, message: str = "") -> tuple[bytes, bytes]:
        """The refusal's content type and body in the shape of the place asked: the REST API's and the
        OpenAI-compatible API's JSON errors (``webapp.core.views.bad_request``), else a small page. ``message``: one
        other than the size limit's (the disk's room)."""
        message = message or self._limit_message(reason)
        api = json_api_at(path)
        if api == "rest":
            return b"application/json", json.dumps({"detail": message}).encode()
        if api == "openai":
            return b"application/json", json.dumps({"error": {
                "message": message, "type": "invalid_request_error", "param": None, "code": "request_too_large"}}).encode()
        page = (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Too large</title></head>"
                f"<body><h1>The upload is too large</h1><p>{html.escape(message[0].upper() + message[1:])}.</p>"
                "<p>Go back to the form.</p></body></html>")
        return b"text/html; charset=utf-8", page.encode()

    def _limit_message(self, reason: str) -> str:
        """Why a body past the limit of ``reason`` (``_limit``'s) is refused."""
        if reason == "upload":
            message = (f"the request body is over the upload limit of {self.upload_bytes} bytes "
                       f"(TEMPER_MAX_UPLOAD_BYTES); {TOO_LARGE_REMEDY}")
        elif reason == "model":
            message = (f"the request body is over the model upload limit of {self.model_upload_bytes} bytes "
                       "(TEMPER_MODEL_UPLOAD_MAX_BYTES); ask an administrator to raise it, or to copy the model under "
                       "the models root")
        elif reason == "model sender":
            message = (f"the request body is over the {self.other_bytes} bytes this address takes from a sender who "
                       "may not upload here: a model archive is taken from an owner of the project (signed in, or "
                       "in the REST API with an owner's token from the API tokens page)")
        elif reason == "sender":
            message = (f"the request body is over the {self.other_bytes} bytes this address takes from a sender who "
                       "may not upload here: a dataset file is taken from a signed-in member of the project (in the "
                       "REST API, sent with a member's token from the API tokens page)")
        else:
            message = (f"the request body is over the {self.other_bytes} bytes this address takes "
                       "(files are uploaded on a project's Datasets pages or POST /api/v1/projects/<slug>/datasets/)")
        return message


def may_upload(headers: dict[bytes, bytes], *, slug: str, api: bool, role: str = Role.MEMBER) -> bool:
    """Whether the sender of ``headers`` may upload to project ``slug``: the user of its session cookie (``api``:
    of its REST API token) is active and has ``role`` or a higher one there, as the upload views require. Run in a thread of
    its own, outside any request's: the connection it opened is closed before it returns."""
    try:
        if api:
            user = token_authenticate(headers.get(b"authorization", b"").decode("latin-1"))
        else:
            session_key = parse_cookie(headers.get(b"cookie", b"").decode("latin-1")).get(settings.SESSION_COOKIE_NAME)
            if not session_key:
                return False
            session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
            user = get_user(SimpleNamespace(session=session))  # the session's user, as AuthenticationMiddleware's
        if user is None or not user.is_authenticated or not user.is_active:
            return False
        held = Membership.objects.filter(project__slug=slug, user=user).values_list("role", flat=True).first()
        return held is not None and role_at_least(held, role)
    finally:
        connections.close_all()
