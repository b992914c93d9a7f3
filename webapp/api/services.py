"""API tokens: create (the secret is returned once), revoke, and authenticate a request's bearer."""
from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.utils import timezone

from webapp.api.models import ApiToken
from webapp.core.text import checked_text
from webapp.core.auth_header import bearer_secret

TOKEN_PREFIX = "tmp_"
# A token's last use is written at most this often (one write per request would be wasteful).
LAST_USED_RESOLUTION = timedelta(minutes=1)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_create(*, user: AbstractBaseUser, name: str) -> tuple[ApiToken, str]:
    """A new token for ``user``: ``(row, secret)``; the secret is not stored and cannot be shown again."""
    name = checked_text(name.strip(), field="name", max_length=100)  # ApiToken.name's max_length: refused, not cut
    if not name:
        raise ValidationError({"name": "name the token after where it is used, e.g. 'laptop' or 'ci'"})
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, digest=_digest(secret), prefix=secret[:10])
    return token, secret


def token_revoke(*, user: AbstractBaseUser, token_id: int) -> bool:
    """Delete one of ``user``'s tokens; False when there was none of that id (revoked already, or never theirs)."""
    deleted, _by_model = ApiToken.objects.filter(user=user, pk=token_id).delete()
    return bool(deleted)


def token_authenticate(header: str) -> AbstractBaseUser | None:
    """The active user whose token is in ``Authorization: Bearer <token>``, else None."""
    secret = bearer_secret(header)
    if secret is None or not secret.startswith(TOKEN_PREFIX):
        return None
    token = ApiToken.objects.select_related("user").filter(digest=_digest(secret)).first()
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user
