"""Project-scoped tokens of the OpenAI-compatible API: create, authenticate."""
from __future__ import annotations

import secrets
from datetime import datetime

from django.db import transaction
from django.db.models import OuterRef, QuerySet, Subquery

from webapp.activity.models import Verb
from webapp.activity.services import activity_record
from webapp.chat.models import ProjectToken
from webapp.core.auth_header import bearer_secret, note_token_use, token_digest, token_expired
from webapp.core.templatetags.temper import when
from webapp.core.text import checked_text
from webapp.projects.models import Membership, Project, Role, role_at_least

TOKEN_PREFIX = "tpk_"


TOKEN_NAME_MAX = 100  # ProjectToken.name's max_length, as ApiToken's
DEFAULT_TOKEN_NAME = "token"  # a token made with a blank name: the Chat page's form may be sent without one


@transaction.atomic
def project_token_create(*, user, project: Project, name: str,
                         expires_at: datetime | None = None) -> tuple[ProjectToken, str]:
    """A new token of ``user`` for ``project`` (they must be a member or owner), refused from ``expires_at`` on
    (None: until revoked); returns (row, secret). A blank ``name`` is ``DEFAULT_TOKEN_NAME``."""
    membership = Membership.objects.filter(project=project, user=user).first()
    if membership is None:
        raise PermissionError(f"{user.get_username()} is not in project {project.slug}; only its members and "
                              "owners may chat")
    if not role_at_least(membership.role, Role.MEMBER):
        raise PermissionError(f"{user.get_username()} is a {membership.role} of {project.slug}; only its members and "
                              "owners may chat: make them a member on the Members page")
    name = name.strip() or DEFAULT_TOKEN_NAME
    checked_text(name, field="name", max_length=TOKEN_NAME_MAX)  # refused, not cut
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ProjectToken.objects.create(user=user, project=project, name=name, digest=token_digest(secret),
                                        prefix=secret[:10], expires_at=expires_at)
    activity_record(project=project, actor=user, verb=Verb.CHAT_TOKEN_CREATED, target=token)
    return token, secret


def _token_in(header: str) -> tuple[ProjectToken | None, str | None]:
    """The project token in ``Authorization: Bearer <token>`` (None when there is none such) and, when
    it may not be used now (expired; its user deactivated, left the project, now a viewer), why, in words."""
    secret = bearer_secret(header)
    if secret is None:
        return None, None
    token = _with_role().filter(digest=token_digest(secret)).first()
    return (None, None) if token is None else (token, _refusal(token))


def _with_role():
    # One query: every API request asks this. ``role`` is the user's role in the project now (None: gone).
    role = Membership.objects.filter(project=OuterRef("project"), user=OuterRef("user")).values("role")[:1]
    return ProjectToken.objects.select_related("user", "project").annotate(role=Subquery(role))


def _refusal(token: ProjectToken) -> str | None:
    who, project = token.user.get_username(), token.project.slug
    if token_expired(token):
        return (f"this token expired at {when(token.expires_at)}; make a new one on the Chat page of {project}, "
                f"under 'API tokens for this project', or with a REST API token: POST /api/v1/projects/{project}/"
                "chat-tokens/")
    if not token.user.is_active:
        return f"this token's user, {who}, is deactivated"
    if token.role is None:
        return f"this token's user, {who}, is no longer a member of {project}"
    if not role_at_least(token.role, Role.MEMBER):
        return (f"this token's user, {who}, is now a {token.role} of {project}; only its members and "
                "owners may use its tokens")
    return None


def project_token_standing(*, token_id: int) -> str | None:
    """Why the token ``token_id`` may no longer be used, in words (revoked, expired, its user deactivated, gone
    from its project or now a viewer), or None while it may: asked again while a ``/v1/`` answer it started streams
    (``openai_api._token_watch``), so that the answer does not outlive the token's right to it."""
    token = _with_role().filter(pk=token_id).first()
    return "this token was revoked" if token is None else _refusal(token)


def project_token_authenticate(header: str) -> ProjectToken | None:
    """The token in ``Authorization: Bearer <token>`` while it has not expired and its user is active and still a
    member of its project, else None."""
    token, refusal = _token_in(header)
    if token is None or refusal is not None:
        return None
    note_token_use(token)
    return token


def project_token_refusal(header: str) -> tuple[str, bool] | None:
    """Why a project token that exists is refused, in words, and whether that is because it expired (the token
    itself no longer counts, rather than its user's standing); None when there is no such token (or it is
    accepted)."""
    token, refusal = _token_in(header)
    return None if refusal is None else (refusal, token_expired(token))


def project_token_list(*, user, project: Project) -> QuerySet[ProjectToken]:
    """``user``'s own tokens for ``project``, newest first: nobody else's, an owner's neither."""
    return ProjectToken.objects.filter(project=project, user=user)


@transaction.atomic
def project_token_revoke(*, user, project: Project, token_id: int) -> ProjectToken | None:
    """Delete one of ``user``'s tokens for ``project``; returns it, or None when there was none such (revoked
    already: no error)."""
    token = ProjectToken.objects.filter(pk=token_id, user=user, project=project).first()
    if token is not None:
        token.delete()
        activity_record(project=project, actor=user, verb=Verb.CHAT_TOKEN_REVOKED, target=token)
    return token


def project_tokens_revoke_all(*, user, project: Project) -> None:
    """Delete every token of ``user`` for ``project``, who has left it or become a viewer: refused meanwhile,
    they would work again once the user is added back or promoted, unasked (GitHub revokes a removed
    collaborator's access the same way)."""
    ProjectToken.objects.filter(user=user, project=project).delete()
