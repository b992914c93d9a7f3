"""Forms that queue work or make data are acted on once per sending, on the server.

Design note: ``static/forms.js`` stops a double click, but not two identical POSTs from a script, a
proxy that retries, or Back and send again: each launched a run and queued its task. Every such
form carries a one-time token (``{% submission_token %}``, a hidden field), and its view makes
the thing through ``form_send_once``: it claims a ``Submission`` keyed by the user, the address posted to, the
token and the fields sent (a digest), in a transaction of its own, committed before the work starts, then calls the
service and fills in what it made in the service's transaction. The unique key decides between concurrent sendings:
the second finds the first's claim and waits for it (polling the row, at most ``WAIT_FOR_FIRST_SECONDS``), then is
answered with what the first made — the same redirect, with a note — and queues nothing; still unfinished, it is
refused with ``SendingInProgress`` ("try again in a minute": a 409 in the API, a message on the page). The claim is
committed first, not in the service's transaction, because some work precedes that transaction (``prepare``:
unpacking a model archive, minutes outside any transaction): a retry that arrived meanwhile saw nothing and unpacked
too, to be refused "name taken". A sending that fails (a validation error) gives its claim up, so sending it again
is tried again (and a retry waiting on it takes it); a claim whose process died (a restart mid-upload) is taken over
once it is ``CLAIM_TAKEN_OVER_AFTER`` old, longer than a sending's work takes (a model archive unpacks in minutes),
and the first's work, were it still going, is then rolled back, not kept twice. The fields are part of the key:
after Back, a form sent unchanged is a
repeat, one the user changed is a new launch (a page the browser fetches again on Back has a new
token; ``static/forms.js`` puts back the one the form was sent with). A file is part of the fields by its name, size
and content; a form whose files run to gigabytes (a model archive) passes ``sample_files``, and its files are told
apart by their name, size and first and last MiB: reading 20 GB to hash it took minutes, and a file changed only in
its middle, sent again under the same one-time token, is not a case worth them (Back and a different file of the same
size and ends). The API does the same for a request with an
``Idempotency-Key`` header (``request_send_once``), but there the key
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
import time
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
# How long a sending waits for an identical one already at work to finish, and how often it looks.
WAIT_FOR_FIRST_SECONDS = 20.0
POLL_SECONDS = 0.25
# A claim this old is a dead process's, taken over by the next identical sending (see the module note).
CLAIM_TAKEN_OVER_AFTER = timedelta(minutes=30)
STILL_BEING_PROCESSED = ("The same request is still being processed (sent twice: a retry, or a second click); "
                         "try again in a minute to get what it made.")
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


class SendingInProgress(ValidationError):
    """The same sending is still at work after ``WAIT_FOR_FIRST_SECONDS`` (see the module note): a ``ValidationError``
    so that a page shows it as it shows a refusal (nothing was made); the API answers it with a 409."""

    def __init__(self):
        super().__init__(STILL_BEING_PROCESSED)


def send_once(*, user, form: str, token: str, fields: bytes, create: Callable[[], str],
              token_name: str = TOKEN_FIELD, prepare: Callable[[], None] | None = None) -> Sent:
    """Call ``create`` (it makes the thing and returns its page address or id) unless ``user``
    sent ``form`` (the address posted to) with this ``token`` and these ``fields`` in the last
    ``KEEP_DAYS``; then return what that made.

    ``create``'s errors propagate and leave no record. ``prepare``: work done first, once the sending is claimed,
    outside any transaction (unpacking an archive); ``create`` then runs in a transaction of its own. Without a
    token, both are called. A token longer than ``MAX_TOKEN_CHARS`` is refused (a ``ValidationError`` on
    ``token_name``) rather than cut: two keys that differ past the cut would be one sending. An identical sending
    still at work after ``WAIT_FOR_FIRST_SECONDS``: ``SendingInProgress``."""
    if not token:
        return _unrecorded(create=create, prepare=prepare)
    _check_token_length(token, token_name=token_name)
    return _record_once(user=user, key=_form_key(form, token, fields), body_digest="", create=create, path=form,
                        prepare=prepare)


def _unrecorded(*, create: Callable[[], str], prepare: Callable[[], None] | None) -> Sent:
    if prepare is not None:
        prepare()
    return Sent(result=create(), created=True)


def _form_key(form: str, token: str, fields: bytes) -> str:
    return hashlib.sha256(json.dumps([form, token]).encode() + b"\0" + fields).hexdigest()


def _check_token_length(token: str, *, token_name: str) -> None:
    if len(token) > MAX_TOKEN_CHARS:
        raise ValidationError({token_name: f"{token_name} is {len(token)} characters long; "
                                           f"it may be at most {MAX_TOKEN_CHARS}"})


def _record_once(*, user, key: str, body_digest: str, create: Callable[[], str], path: str,
                 prepare: Callable[[], None] | None = None) -> Sent:
    """Claim ``key`` for ``user`` (``_claim``), then call ``prepare`` and ``create``, the latter in a transaction that
    also stores what it made; a failure gives the claim up. When ``key`` is claimed already, what its first sending
    made (``_claim``)."""
    claim = _claim(user=user, key=key, body_digest=body_digest, path=path)
    if isinstance(claim, Sent):
        return claim
    pk, claimed_by = claim
    try:
        if prepare is not None:
            prepare()
        with transaction.atomic():
            result = create()
            # The claim, taken over meanwhile (this sending outlived CLAIM_TAKEN_OVER_AFTER): the one that took it
            # makes the thing, and this work is rolled back rather than kept twice.
            if not Submission.objects.filter(pk=pk, claimed_by=claimed_by).update(result=result, claimed_by=""):
                raise SendingInProgress()
    except BaseException:
        Submission.objects.filter(pk=pk, claimed_by=claimed_by).delete()
        raise
    return Sent(result=result, created=True)


def _claim(*, user, key: str, body_digest: str, path: str) -> tuple[int, str] | Sent:
    """Store ``key`` for ``user`` as claimed, in a transaction of its own: the claim's id and mark. When it is stored
    already: what its first sending made, once that is done (waited for, ``WAIT_FOR_FIRST_SECONDS`` at most, then
    ``SendingInProgress``); ``IdempotencyKeyReused`` if that sending's ``body_digest`` differs (form sendings store
    none: their fields are part of their key); the claim itself when that sending gave it up (it failed) or died
    holding it (``CLAIM_TAKEN_OVER_AFTER``)."""
    give_up_at = time.monotonic() + WAIT_FOR_FIRST_SECONDS
    claimed_by = secrets.token_hex(16)
    while True:
        # Read first: on SQLite an INSERT waits for the write lock, which the first's service holds while it works.
        first = Submission.objects.filter(user=user, key=key, created_at__gte=_kept_since()).first()
        if first is None:
            try:
                with transaction.atomic():
                    _forget_old_submissions()
                    return Submission.objects.create(user=user, key=key, body_digest=body_digest,
                                                     claimed_by=claimed_by).pk, claimed_by
            except IntegrityError:  # claimed meanwhile
                continue
        if first.body_digest != body_digest:
            raise IdempotencyKeyReused(path=path)
        if not first.claimed_by:
            return Sent(result=first.result, created=False)
        now = timezone.now()
        if first.created_at < now - CLAIM_TAKEN_OVER_AFTER:
            if Submission.objects.filter(pk=first.pk, claimed_by=first.claimed_by).update(claimed_by=claimed_by,
                                                                                           created_at=now):
                return first.pk, claimed_by
            continue
        if time.monotonic() >= give_up_at:
            raise SendingInProgress()
        time.sleep(POLL_SECONDS)


def _forget_old_submissions() -> None:
    """Delete the records past ``KEEP_DAYS`` (a token older than that is a new sending). In a claim's transaction,
    not in the service's: on PostgreSQL one sending then holds no row locks of everyone's old records while its
    service runs (another sending's delete of the same rows would wait on it)."""
    Submission.objects.filter(created_at__lt=_kept_since()).delete()


def _kept_since():
    return timezone.now() - timedelta(days=KEEP_DAYS)


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


def posted_once(request: HttpRequest, *, create: Callable[[], str], sample_files: bool = False,
                prepare: Callable[[], None] | None = None) -> Sent:
    """``send_once`` for the form POSTed in ``request``, keyed by its address, its ``TOKEN_FIELD`` and its fields:
    what ``create`` made, then or the first time. A page's script answers a repeat itself (the chat's send
    attaches to the first's answer); ``form_send_once`` adds a note for the page redirected to."""
    return send_once(user=request.user, form=request.path, token=request.POST.get(TOKEN_FIELD, ""),
                     fields=_form_fields(request, sample_files=sample_files), create=create, prepare=prepare)


def form_send_once(request: HttpRequest, *, create: Callable[[], str], sample_files: bool = False,
                   prepare: Callable[[], None] | None = None) -> str:
    """The page to redirect to after the form of ``request`` was sent: ``create``'s (it
    makes the thing and returns that page's address), or, for a repeat, the first sending's, with
    a note that says so (see the module note; ``sample_files`` and ``prepare`` there and in ``send_once``)."""
    sent = posted_once(request, create=create, sample_files=sample_files, prepare=prepare)
    if not sent.created:
        messages.info(request, ALREADY_SENT)
    return sent.result


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
    sent, secret = _sent_once_keeping_the_secret(lambda made: posted_once(request, create=made), create)
    return sent.result, secret


def request_send_once_secret(request: HttpRequest, *, create: Callable[[], tuple[str, str]]) -> tuple[Sent, str]:
    """``request_send_once`` for an API request that makes a secret shown once (a new project token): ``create``
    returns ``(id, secret)`` and only the id is kept. Returns what was sent (its ``result`` the id) and the secret,
    "" for a repeat with the first's ``Idempotency-Key``, which made nothing and cannot show it again."""
    return _sent_once_keeping_the_secret(lambda made: request_send_once(request, create=made), create)


def _sent_once_keeping_the_secret(send: Callable[[Callable[[], str]], Sent],
                                  create: Callable[[], tuple[str, str]]) -> tuple[Sent, str]:
    secrets_made: list[str] = []

    def create_keeping_the_id() -> str:
        made_id, secret = create()
        secrets_made.append(secret)
        return made_id

    sent = send(create_keeping_the_id)
    return sent, secrets_made[0] if sent.created else ""


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


def request_send_once(request: HttpRequest, *, create: Callable[[], str], sample_files: bool = False,
                      prepare: Callable[[], None] | None = None) -> Sent:
    """``send_once`` for an API request with an ``Idempotency-Key`` header: the address and key are
    the record's key, the body (a JSON body, or the fields and files of a form upload; ``sample_files`` as for
    ``form_send_once``) is compared with the first's. Sent again with the same body: what the first made; with
    another body: ``IdempotencyKeyReused``; while the first is still at work: ``SendingInProgress``. Without the
    header, ``prepare`` and ``create`` are called."""
    token = request.headers.get(IDEMPOTENCY_HEADER, "")
    if not token:
        return _unrecorded(create=create, prepare=prepare)
    key, body_digest = _request_key(request, token, sample_files=sample_files)
    return _record_once(user=request.user, key=key, body_digest=body_digest, create=create, path=request.path,
                        prepare=prepare)


def _request_key(request: HttpRequest, token: str, *, sample_files: bool) -> tuple[str, str]:
    """The record's key of an API request sent with the ``Idempotency-Key`` ``token``, and its body's digest."""
    _check_token_length(token, token_name=IDEMPOTENCY_HEADER)
    form_body = request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded")
    body = _form_fields(request, sample_files=sample_files) if form_body else request.body
    # "api" keeps these keys apart from the forms', whose digests take the fields in too.
    key = hashlib.sha256(json.dumps(["api", request.path, token]).encode()).hexdigest()
    return key, hashlib.sha256(body).hexdigest()
