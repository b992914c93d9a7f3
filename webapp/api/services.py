"""API tokens: create (the secret is returned once), revoke, and authenticate a request's bearer."""
from __future__ import annotations

import secrets
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError

from webapp.api.models import ApiToken
from webapp.core.auth_header import bearer_secret, note_token_use, token_digest, token_expired
from webapp.core.text import checked_text

TOKEN_PREFIX = "tmp_"
def token_create(*, user: AbstractBaseUser, name: str, expires_at: datetime | None = None) -> tuple[ApiToken, str]:
    """A new token for ``user``, refused from ``expires_at`` on (None: until revoked): ``(row, secret)``; the
    secret is not stored and cannot be shown again."""
    name = checked_text(name.strip(), field="name", max_length=100)  # ApiToken.name's max_length: refused, not cut
    if not name:
        raise ValidationError({"name": "name the token after where it is used, e.g. 'laptop' or 'ci'"})
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, digest=token_digest(secret), prefix=secret[:10],
                                    expires_at=expires_at)
    return token, secret


def token_revoke(*, user: AbstractBaseUser, token_id: int) -> bool:
    """Delete one of ``user``'s tokens; False when there was none of that id (revoked already, or never theirs)."""
    deleted, _by_model = ApiToken.objects.filter(user=user, pk=token_id).delete()
    return bool(deleted)


def token_authenticate(header: str) -> AbstractBaseUser | None:
    """The active user whose token, unexpired, is in ``Authorization: Bearer <token>``, else None."""
    token = _token_in(header)
    if token is None or not token.user.is_active or token_expired(token):
        return None
    note_token_use(token)
    return token.user


def token_expired_at(header: str) -> datetime | None:
    """When the token in ``Authorization: Bearer <token>`` expired; None when there is no such token or it works."""
    token = _token_in(header)
    return token.expires_at if token is not None and token_expired(token) else None


def _token_in(header: str) -> ApiToken | None:
    secret = bearer_secret(header)
    if secret is None or not secret.startswith(TOKEN_PREFIX):
        return None
    return ApiToken.objects.select_related("user").filter(digest=token_digest(secret)).first()
