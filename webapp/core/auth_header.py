"""The credentials of an ``Authorization`` header, shared by the REST API and the OpenAI-compatible API:
the bearer secret, the digest a token is stored by, and when a token was last used."""
from __future__ import annotations

import hashlib
from datetime import timedelta

from django.db.models import Model
from django.utils import timezone

# A token's last use is written at most this often: one write per request would make every API call a
# database write (and, on SQLite, take the write lock) for a date the tokens pages show to the minute.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def bearer_secret(header: str) -> str | None:
    """The secret of ``Authorization: Bearer <secret>``, else None. The scheme's name is case-insensitive
    (RFC 9110, 11.1): clients that send ``bearer`` are answered like those that send ``Bearer``."""
    scheme, _, secret = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    return secret.strip()


def token_digest(secret: str) -> str:
    """What a token is stored and looked up by: its secret is shown once and never stored."""
    return hashlib.sha256(secret.encode()).hexdigest()


def note_token_use(token: Model) -> None:
    """Set ``token.last_used_at`` to now when it is older than ``LAST_USED_RESOLUTION`` (or unset)."""
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        type(token).objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
