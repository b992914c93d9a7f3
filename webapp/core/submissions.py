"""Forms that queue work or make data are acted on once per sending, on the server.

Design note: ``static/forms.js`` stops a double click, but not two identical POSTs from a script, a
proxy that retries, or Back and send again: each launched a run and queued its task. Every such
form carries a one-time token (``{% submission_token %}``, a hidden field), and its view makes
the thing through ``form_send_once``: in one transaction it stores a ``Submission`` keyed by the
user, the address posted to, the token and the fields sent (a digest), then calls the service. The
unique key decides between concurrent sendings (the second INSERT waits for the first's commit
and fails), and a repeat is answered with what the first made — the same redirect, with a note —
and queues nothing. A sending that fails (a validation error) rolls its record back, so sending
it again is tried again. The fields are part of the key: after Back, a form sent unchanged is a
repeat, one the user changed is a new launch (a page the browser fetches again on Back has a new
token; ``static/forms.js`` puts back the one the form was sent with). A file is part of the fields by its name, size
and content; a form whose files run to gigabytes (a model archive) passes ``sample_files``, and its files are told
apart by their name, size and first and last MiB: reading 20 GB to hash it took minutes, and a file changed only in
its middle, sent again under the same one-time token, is not a case worth them (Back and a different file of the same
size and ends). Such a form's view asks ``form_sent_before`` first, so that a repeat is answered before the minutes
of work that precede its transaction (unpacking the archive). The API does the same for a request with an
``Idempotency-Key`` header (``request_send_once``; ``request_sent_before`` ahead of such work), but there the key
alone is the record's key, and the body's digest is kept beside it: a client's key stands for one request
(the IETF idempotency-key draft, as Stripe), so the key sent again with another body is a mistake
to report (``IdempotencyKeyReused``, a 422), neither a second thing made nor the first's answer
passed off as this one's. A sending without a token (older scripts) is acted on every time.

A new API token's secret is shown on the response to the sending that made it and never stored,
so a repeat cannot show it: ``form_send_once_secret`` keeps only the token's id, and its views
answer a repeat with ``secret_already_shown`` (``note_secret_already_shown``) instead of making a
second token.
"""
from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.http import Http404, HttpRequest
from django.utils import timezone

from webapp.core.bidi import isolated
from webapp.core.models import Submission

TOKEN_FIELD = "submission_token"
IDEMPOTENCY_HEADER = "Idempotency-Key"
# A token sent again after this long makes the thing again; the records older are deleted.
KEEP_DAYS = 7
MAX_TOKEN_CHARS = 200
ALREADY_SENT = "This form was already sent; this is what it made. Change it to make another."
GONE_ALREADY = "Nothing to delete: it is gone already (deleted meanwhile, perhaps by someone else)."
# How much of each end of a file ``sample_files`` reads.
SAMPLE_BYTES = 1024 * 1024
# Fields that differ between two sendings of one form without the user changing anything.
_NOT_FIELDS = {TOKEN_FIELD, "csrfmiddlewaretoken"}


def new_submission_token() -> str:
    return secrets.token_urlsafe(18)


@dataclass(frozen=True)
class Sent:
    """What a sending made (``result``: what ``create`` returned, then or the first time) and
    whether this sending made it."""

    result: str
    created: bool


class IdempotencyKeyReused(Exception):
    """An API request's ``Idempotency-Key`` was sent before with another body (see the module note);
    the message is for the client."""

    def __init__(self, *, path: str):
        super().__init__(f"{IDEMPOTENCY_HEADER} reused with a different request body: this key was first sent to "
                         f"{path} with another body, and that request is the one it stands for. Send a new key for "
                         "a new request, or the first body again to get what it made.")


def send_once(*, user, form: str, token: str, fields: bytes, create: Callable[[], str],
              token_name: str = TOKEN_FIELD) -> Sent:
    """Call ``create`` (it makes the thing and returns its page address or id) unless ``user``
    sent ``form`` (the address posted to) with this ``token`` and these ``fields`` in the last
    ``KEEP_DAYS``; then return what that made.

    ``create``'s errors propagate and leave no record. Without a token, ``create`` is called. A
    token longer than ``MAX_TOKEN_CHARS`` is refused (a ``ValidationError`` on ``token_name``)
    rather than cut: two keys that differ past the cut would be one sending."""
    if not token:
        return Sent(result=create(), created=True)
    _check_token_length(token, token_name=token_name)
    return _record_once(user=user, key=_form_key(form, token, fields), body_digest="", create=create, path=form)


def _form_key(form: str, token: str, fields: bytes) -> str:
    return hashlib.sha256(json.dumps([form, token]).encode() + b"\0" + fields).hexdigest()


def _check_token_length(token: str, *, token_name: str) -> None:
    if len(token) > MAX_TOKEN_CHARS:
        raise ValidationError({token_name: f"{token_name} is {len(token)} characters long; "
                                           f"it may be at most {MAX_TOKEN_CHARS}"})


def _record_once(*, user, key: str, body_digest: str, create: Callable[[], str], path: str) -> Sent:
    """Store ``key`` for ``user`` and call ``create``, in one transaction; when ``key`` is stored
    already, what its first sending made, or ``IdempotencyKeyReused`` if that sending's
    ``body_digest`` differs (form sendings store none: their fields are part of their key)."""
    _forget_old_submissions()
    with transaction.atomic():
        try:
            with transaction.atomic():
                submission = Submission.objects.create(user=user, key=key, body_digest=body_digest)
        except IntegrityError:
            first = Submission.objects.get(user=user, key=key)
            if first.body_digest != body_digest:
                raise IdempotencyKeyReused(path=path) from None
            return Sent(result=first.result, created=False)
        result = create()
        Submission.objects.filter(pk=submission.pk).update(result=result)
    return Sent(result=result, created=True)


def _forget_old_submissions() -> None:
    """Delete the records past ``KEEP_DAYS``. Before a sending's transaction, not inside it: a
    token older than that is then a new sending (its stale record would otherwise still be
    found), and on PostgreSQL one sending does not hold the row locks of everyone's old records
    while its service runs (another sending's delete of the same rows would wait on it)."""
    Submission.objects.filter(created_at__lt=timezone.now() - timedelta(days=KEEP_DAYS)).delete()


def _form_fields(request: HttpRequest, *, sample_files: bool = False) -> bytes:
    """The POSTed fields and files, in a stable order; files by name, size and content (with ``sample_files``, the
    content's first and last ``SAMPLE_BYTES`` only)."""
    digest = hashlib.sha256()
    fields = sorted((name, request.POST.getlist(name)) for name in request.POST if name not in _NOT_FIELDS)
    digest.update(json.dumps(fields).encode())
    for name in sorted(request.FILES):
        for upload in request.FILES.getlist(name):
            digest.update(b"\0" + json.dumps([name, upload.name, upload.size]).encode())
            if sample_files:
                upload.seek(0)
                digest.update(upload.read(SAMPLE_BYTES))
                upload.seek(max(upload.size - SAMPLE_BYTES, 0))
                digest.update(upload.read(SAMPLE_BYTES))
            else:
                for chunk in upload.chunks():
                    digest.update(chunk)
            upload.seek(0)
    return digest.digest()


def form_send_once(request: HttpRequest, *, create: Callable[[], str], sample_files: bool = False) -> str:
    """The page to redirect to after the form of ``request`` was sent: ``create``'s (it
    makes the thing and returns that page's address), or, for a repeat, the first sending's, with
    a note that says so (see the module note; ``sample_files`` there too)."""
    sent = send_once(user=request.user, form=request.path, token=request.POST.get(TOKEN_FIELD, ""),
                     fields=_form_fields(request, sample_files=sample_files), create=create)
    if not sent.created:
        messages.info(request, ALREADY_SENT)
    return sent.result


def form_sent_before(request: HttpRequest, *, sample_files: bool = False) -> str | None:
    """What the first sending of the form of ``request`` made, with ``form_send_once``'s note, when this sending
    repeats it; else None. For a form whose work before ``form_send_once`` takes minutes: a repeat is answered
    before that work (two sendings at once both pass here, and ``form_send_once`` decides between them).
    A token too long is refused as ``form_send_once`` refuses it."""
    token = request.POST.get(TOKEN_FIELD, "")
    if not token:
        return None
    _check_token_length(token, token_name=TOKEN_FIELD)
    key = _form_key(request.path, token, _form_fields(request, sample_files=sample_files))
    first = Submission.objects.filter(user=request.user, key=key,
                                      created_at__gte=timezone.now() - timedelta(days=KEEP_DAYS)).first()
    if first is None:
        return None
    messages.info(request, ALREADY_SENT)
    return first.result


def sent_once_or_refused(request: HttpRequest, *, create: Callable[[], str], back: str) -> str:
    """Where an action's form goes: ``create()``'s page (``form_send_once``), or ``back`` with each message of
    the ``ValidationError`` that refused it shown as an error."""
    try:
        return form_send_once(request, create=create)
    except ValidationError as error:
        for text in error.messages:
            messages.error(request, text)
    return back


def deleted_once_or_refused(request: HttpRequest, *, delete: Callable[[], str], back: str,
                            gone: str | None = None) -> str:
    """Where a deletion form goes: ``delete()``'s page (it looks its object up itself, so that a second
    click, finding it gone, lands where the first did: ``form_send_once``), or ``back`` with an error
    saying what still needs the object and that nothing was deleted (its ``ValidationError``), or ``gone``
    (the list the object was in) when ``delete()`` finds it gone already: deleted meanwhile from another
    page, by this person or a teammate, whose sending is another form's (an ``Http404``). Without ``gone``
    that stays a 404: for what is private to its author, or a project, a 404 is what outsiders get too."""
    try:
        return form_send_once(request, create=delete)
    except ValidationError as error:
        messages.error(request, "Nothing was deleted: " + "; ".join(error.messages) + ".")
    except Http404:
        if gone is None:
            raise
        messages.info(request, GONE_ALREADY)
        return gone
    return back


def form_send_once_secret(request: HttpRequest, *, create: Callable[[], tuple[str, str]]) -> tuple[str, str]:
    """``form_send_once`` for a form that makes a secret shown once (a new API token): ``create``
    makes it and returns ``(id, secret)``, and only the id is kept. Returns ``(id, secret)`` for the
    first sending, ``(the first sending's id, "")`` for a repeat, which made nothing."""
    secrets_made: list[str] = []

    def create_keeping_the_id() -> str:
        made_id, secret = create()
        secrets_made.append(secret)
        return made_id

    sent = send_once(user=request.user, form=request.path, token=request.POST.get(TOKEN_FIELD, ""),
                     fields=_form_fields(request), create=create_keeping_the_id)
    return sent.result, secrets_made[0] if sent.created else ""


def secret_already_shown(*, token_name: str | None) -> str:
    """What a repeated sending of a form that made an API token says (``form_send_once_secret``);
    ``token_name`` None: the token has been revoked since."""
    if token_name is None:
        return ("This form was already sent and made a token, revoked since; its secret was shown only on the "
                "page that answered that first sending. Create a new token with the form here.")
    return (f"This form was already sent and made the token {isolated(token_name)}; its secret was shown only on "
            "the page that answered that first sending, and it is not kept, so it cannot be shown again. If you did "
            "not copy it, revoke that token and create a new one with the form here.")


def note_secret_already_shown(request: HttpRequest, *, tokens: QuerySet, token_id: str) -> None:
    """The note a token view adds for a repeated sending (``form_send_once_secret`` returned no
    secret): ``secret_already_shown`` with the name of the token the first sending made, looked up
    by ``token_id`` among ``tokens`` (the user's own, so an id cannot name someone else's), or
    saying it has been revoked since."""
    name = tokens.filter(pk=token_id).values_list("name", flat=True).first()
    messages.info(request, secret_already_shown(token_name=name))


def request_send_once(request: HttpRequest, *, create: Callable[[], str], sample_files: bool = False) -> Sent:
    """``send_once`` for an API request with an ``Idempotency-Key`` header: the address and key are
    the record's key, the body (a JSON body, or the fields and files of a form upload; ``sample_files`` as for
    ``form_send_once``) is compared with the first's. Sent again with the same body: what the first made; with
    another body: ``IdempotencyKeyReused``. Without the header, ``create`` is called."""
    token = request.headers.get(IDEMPOTENCY_HEADER, "")
    if not token:
        return Sent(result=create(), created=True)
    key, body_digest = _request_key(request, token, sample_files=sample_files)
    return _record_once(user=request.user, key=key, body_digest=body_digest, create=create, path=request.path)


def request_sent_before(request: HttpRequest, *, sample_files: bool = False) -> Sent | None:
    """What the first request under this ``Idempotency-Key`` made (``created`` False) when ``request`` repeats it,
    ``IdempotencyKeyReused`` when that one's body was another; else None. ``form_sent_before`` for the API: asked
    before minutes of work that precede ``request_send_once`` (unpacking a model archive)."""
    token = request.headers.get(IDEMPOTENCY_HEADER, "")
    if not token:
        return None
    key, body_digest = _request_key(request, token, sample_files=sample_files)
    first = Submission.objects.filter(user=request.user, key=key,
                                      created_at__gte=timezone.now() - timedelta(days=KEEP_DAYS)).first()
    if first is None:
        return None
    if first.body_digest != body_digest:
        raise IdempotencyKeyReused(path=request.path)
    return Sent(result=first.result, created=False)


def _request_key(request: HttpRequest, token: str, *, sample_files: bool) -> tuple[str, str]:
    """The record's key of an API request sent with the ``Idempotency-Key`` ``token``, and its body's digest."""
    _check_token_length(token, token_name=IDEMPOTENCY_HEADER)
    form_body = request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded")
    body = _form_fields(request, sample_files=sample_files) if form_body else request.body
    # "api" keeps these keys apart from the forms', whose digests take the fields in too.
    key = hashlib.sha256(json.dumps(["api", request.path, token]).encode()).hexdigest()
    return key, hashlib.sha256(body).hexdigest()
