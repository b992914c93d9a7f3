"""The credentials of an ``Authorization`` header, shared by the REST API and the OpenAI-compatible API:
the bearer secret, the digest a token is stored by, when a token was last used and when it expires."""
from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
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


# How long a new token may work, as its form offers it (days; "never": until revoked). A token leaked into a log,
# a shell history or a repository works until someone notices, unless it ends by itself.
TOKEN_LIFETIMES = {"30": 30, "90": 90, "365": 365, "never": None}
DEFAULT_TOKEN_LIFETIME = "90"
TOKEN_LIFETIME_CHOICES = [("30", "30 days"), ("90", "90 days"), ("365", "a year"), ("never", "never (until revoked)")]


def token_expiry(lifetime: str, *, field: str = "expires") -> datetime | None:
    """When a token made now for ``lifetime`` (a key of ``TOKEN_LIFETIMES``) stops working; None: never."""
    if lifetime not in TOKEN_LIFETIMES:
        raise ValidationError({field: f"{lifetime!r} is not a lifetime a token may have; choose one of "
                                      f"{', '.join(TOKEN_LIFETIMES)} (days, or never)"})
    days = TOKEN_LIFETIMES[lifetime]
    return None if days is None else timezone.now() + timedelta(days=days)


def token_expired(token: Model, *, now: datetime | None = None) -> bool:
    """Whether ``token`` (an ``expires_at`` of None never expires) no longer works."""
    return token.expires_at is not None and token.expires_at <= (now or timezone.now())
