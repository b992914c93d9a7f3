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


class Project(models.Model):
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=50, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
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
