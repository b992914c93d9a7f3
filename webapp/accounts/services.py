"""Deleting an account outside the admin (``manage.py deleteaccount``). The rules are the foreign keys' own
(docs/architecture.md, *Deleting an account*): what was the person's goes, what was the team's stays, and
an account whose reviews or arena votes count, or that is a project's last owner, is not deleted. Django's
refusal (``ProtectedError``) names only the foreign keys ("'Battle.user'"); this says what the rows are and
what to do."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Model, ProtectedError
from django.template.defaultfilters import pluralize

from webapp.accounts.models import Preferences
from webapp.core.bidi import isolated


def _named(kind: str, names: Iterable[str]) -> str:
    """``kind`` and the distinct ``names``: "project alpha", "projects alpha, beta"."""
    distinct = sorted(set(names))
    return f"{kind}{'' if len(distinct) == 1 else 's'} {', '.join(distinct)}"


def deletion_refusal(user: AbstractBaseUser, protected: Iterable[Model]) -> str:
    """Why ``user`` cannot be deleted, in words, from the rows that block it (a ``ProtectedError``'s)."""
    from webapp.chat.models import Battle  # these apps are built on accounts
    from webapp.projects.models import Membership
    from webapp.review.models import Review

    protected = list(protected)
    reviews = Review.objects.filter(pk__in=[row.pk for row in protected if isinstance(row, Review)])
    battles = Battle.objects.filter(pk__in=[row.pk for row in protected if isinstance(row, Battle)])
    owned = Membership.objects.filter(pk__in=[row.pk for row in protected if isinstance(row, Membership)])
    reasons = []
    if reviews:
        campaigns = _named("review campaign", (isolated(name) for name in
                                               reviews.values_list("item__campaign__name", flat=True)))
        reasons.append(f"they reviewed {len(reviews)} item{pluralize(len(reviews))} ({campaigns}), which count in the items' "
                       "reviews and agreement")
    if battles:
        projects = _named("project", battles.values_list("project__slug", flat=True))
        reasons.append(f"voted in {len(battles)} arena battle{pluralize(len(battles))} ({projects}), which counts in the "
                       "leaderboard and preference pairs")
    text = f"{isolated(user.get_username())} was not deleted: " + ", and ".join(reasons)
    if owned:
        projects = _named("project", owned.values_list("project__slug", flat=True))
        ownership = f"they are the last owner of {projects}: make someone else owner first (the project's Members page)"
        text += (". Also " if reasons else "") + ownership
    return text + (". Deactivate the account instead (its Active box in the admin): it can no longer log in, and "
                   "what it did for the team stays.")


@transaction.atomic
def account_delete(*, user: AbstractBaseUser) -> None:
    """Delete ``user`` with what was theirs; refused (``ValidationError``, ``deletion_refusal``'s words) when
    their reviews or arena votes count, or they are a project's last owner: nothing is deleted then."""
    try:
        user.delete()
    except ProtectedError as error:
        raise ValidationError(deletion_refusal(user, error.protected_objects)) from None


def review_shortcuts_set(*, user: AbstractBaseUser, on: bool) -> Preferences:
    """Turn the reviewing page's single-key shortcuts on or off for ``user``, on every campaign."""
    preferences, _created = Preferences.objects.update_or_create(user=user, defaults={"review_shortcuts": on})
    return preferences


@transaction.atomic
def account_tokens_revoke(*, user: AbstractBaseUser) -> int:
    """Delete every API token of ``user``: their REST tokens (``tmp_``) and their project tokens of the
    OpenAI-compatible API (``tpk_``), in every project; returns how many there were. Called when their password
    changes, whatever changed it (``account_password_changed``): a password changed because it leaked leaves no
    token made with it working."""
    from webapp.api.models import ApiToken  # these apps are built on accounts
    from webapp.chat.models import ProjectToken

    rest, _by_model = ApiToken.objects.filter(user=user).delete()
    project, _by_model = ProjectToken.objects.filter(user=user).delete()
    return rest + project


def account_token_count(*, user: AbstractBaseUser) -> int:
    """How many API tokens ``user`` has, REST and project ones: what ``account_tokens_revoke`` would delete."""
    from webapp.api.models import ApiToken
    from webapp.chat.models import ProjectToken

    return ApiToken.objects.filter(user=user).count() + ProjectToken.objects.filter(user=user).count()


# The accounts whose next new password keeps their API tokens, in this thread or task (api_tokens_kept).
_tokens_kept_for: ContextVar[frozenset[int]] = ContextVar("tokens_kept_for", default=frozenset())


@contextmanager
def api_tokens_kept(*, user: AbstractBaseUser) -> Iterator[None]:
    """A password of ``user`` saved within leaves their API tokens working: the person's own change with its
    "Also revoke my API tokens" box unticked (``throttle.ThrottledPasswordChangeForm``). Every other path revokes."""
    kept = _tokens_kept_for.set(_tokens_kept_for.get() | {user.pk})
    try:
        yield
    finally:
        _tokens_kept_for.reset(kept)


def account_password_changed(*, user: AbstractBaseUser) -> None:
    """What a new password of ``user`` ends besides the old one (the sessions end by themselves: Django's session
    hash): their API tokens, unless kept (``api_tokens_kept``). Called for every password saved, by whatever path
    (``signals``: the password pages, the admin site, ``manage.py changepassword``, ``temper_setup``, the shell),
    so that no path has to remember."""
    if user.pk not in _tokens_kept_for.get():
        account_tokens_revoke(user=user)
