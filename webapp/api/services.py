"""API tokens: create (the secret is returned once), revoke, and authenticate a request's bearer."""
from __future__ import annotations

import secrets

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError

from webapp.api.models import ApiToken
from webapp.core.auth_header import bearer_secret, note_token_use, token_digest
from webapp.core.text import checked_text

TOKEN_PREFIX = "tmp_"
def token_create(*, user: AbstractBaseUser, name: str) -> tuple[ApiToken, str]:
    """A new token for ``user``: ``(row, secret)``; the secret is not stored and cannot be shown again."""
    name = checked_text(name.strip(), field="name", max_length=100)  # ApiToken.name's max_length: refused, not cut
    if not name:
        raise ValidationError({"name": "name the token after where it is used, e.g. 'laptop' or 'ci'"})
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, digest=token_digest(secret), prefix=secret[:10])
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
    token = ApiToken.objects.select_related("user").filter(digest=token_digest(secret)).first()
    if token is None or not token.user.is_active:
        return None
    note_token_use(token)
    return token.user
