"""The one way to look up a project for a request.

Every project-scoped page, API endpoint and service caller goes through
``get_project_for_user``. Anyone who is not a member gets 404, exactly as if the
project did not exist, so outsiders never learn which slugs are taken; a member
whose role is too low for the action gets 403, since they already know the project.

Objects inside a project (datasets, base models, runs) are looked up with their
project: ``Dataset.objects.get(project=project, public_id=...)`` after this getter.
"""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied
from django.http import Http404

from webapp.projects.models import Membership, Project, Role, role_at_least


def get_project_for_user(
    user: AbstractBaseUser | AnonymousUser, slug: str, *, min_role: str = Role.VIEWER
) -> tuple[Project, Membership]:
    """Return ``(project, membership)`` for a member of project ``slug``.

    Raises ``Http404`` when the project does not exist or ``user`` is not a member
    (anonymous users included) and ``PermissionDenied`` when the member's role is
    below ``min_role`` (viewer < member < owner).
    """
    if not user.is_authenticated:
        raise Http404("no such project")
    membership = (
        Membership.objects.select_related("project")
        .filter(project__slug=slug, user=user)
        .first()
    )
    if membership is None:
        raise Http404("no such project")
    if not role_at_least(membership.role, min_role):
        raise PermissionDenied(
            f"this needs the {Role(min_role).label.lower()} role in {slug}; "
            f"you are a {Role(membership.role).label.lower()} — ask a project owner"
        )
    return membership.project, membership
