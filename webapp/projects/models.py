"""Projects and their members.

Every object in Temper (datasets, base models, runs, ...) belongs to exactly one
project; who may see or change it is decided by the user's membership role in that
project, through ``webapp.projects.access`` only.
"""
from __future__ import annotations

from django.conf import settings
from django.db import models


class Role(models.TextChoices):
    """Membership roles, from least to most privileged (see ``ROLE_RANK``)."""

    VIEWER = "viewer", "Viewer"
    MEMBER = "member", "Member"
    OWNER = "owner", "Owner"


# Viewers read; members also create datasets and runs; owners also manage members.
ROLE_RANK: dict[str, int] = {Role.VIEWER: 0, Role.MEMBER: 1, Role.OWNER: 2}


def role_at_least(role: str, minimum: str) -> bool:
    """True when ``role`` grants everything ``minimum`` grants."""
    return ROLE_RANK[role] >= ROLE_RANK[minimum]


# A paragraph or two on what the project is for, shown as plain text under its name: not a place for notes.
DESCRIPTION_MAX_CHARS = 2_000


class Project(models.Model):
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=50, unique=True)
    # db_default: a row written by code from before the column (a migration's older model, a process not yet
    # restarted) gets "" rather than a NOT NULL error.
    description = models.TextField(blank=True, default="", db_default="", max_length=DESCRIPTION_MAX_CHARS, help_text=(
        "What the project is for, as plain text (line breaks kept, no Markdown); its owners change it on its "
        "Settings page."))
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.slug


def protect_last_owners(collector, field, sub_objs, using) -> None:
    """``Membership.user``'s deletion rule: an account's memberships go with it, but an account (or several
    deleted together) that holds the last owner memberships of a project cannot be deleted, as the Members
    page cannot remove a last owner: ``ProtectedError`` names those memberships, and the admin lists them
    and deletes nothing. Make someone else owner first, or deactivate the account."""
    # ``sub_objs`` holds only primary keys (the collector defers the rest): read the rows anew.
    owned = Membership.objects.using(using).filter(pk__in=[membership.pk for membership in sub_objs],
                                                   role=Role.OWNER)
    deleted_together = [user.pk for user in collector.data.get(field.related_model, ())]
    still_owned = (Membership.objects.using(using).filter(project__in=owned.values("project"), role=Role.OWNER)
                   .exclude(user__in=owned.values("user")).exclude(user__in=deleted_together).values("project"))
    stranded = list(owned.exclude(project__in=still_owned).select_related("user", "project"))
    if stranded:
        raise models.ProtectedError("the last owners of a project cannot be deleted", stranded)
    models.CASCADE(collector, field, sub_objs, using)


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=protect_last_owners, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_unique_project_user"),
            models.CheckConstraint(
                condition=models.Q(role__in=[role.value for role in Role]),
                name="membership_role_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"

    def can(self, minimum: str) -> bool:
        """True when this membership's role is at least ``minimum``."""
        return role_at_least(self.role, minimum)

    @property
    def can_act(self) -> bool:
        """Members and owners: what spends the project's compute (launch, chat, arena, review) is
        theirs; viewers read. For templates, which cannot pass ``can`` a role."""
        return self.can(Role.MEMBER)
