"""Reads of projects and memberships for pages."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Case, Count, F, IntegerField, OuterRef, Q, QuerySet, Subquery, Value, When

from webapp.projects.models import ROLE_RANK, Membership, Project


def project_list_for_user(*, user: AbstractBaseUser) -> QuerySet[Project]:
    """The projects ``user`` belongs to, by name, each annotated with ``role`` (the
    user's own) and ``member_count``."""
    own_memberships = Membership.objects.filter(user=user)
    own_role = own_memberships.filter(project=OuterRef("pk")).values("role")[:1]
    return (
        Project.objects.filter(pk__in=own_memberships.values("project_id"))
        .annotate(role=Subquery(own_role), member_count=Count("memberships"))
        .order_by("name", "slug")
    )


def membership_list(*, project: Project) -> QuerySet[Membership]:
    """The members of ``project``: owners first, then members, then viewers; by username."""
    rank = Case(
        *(When(role=role, then=Value(rank)) for role, rank in ROLE_RANK.items()),
        output_field=IntegerField(),
    )
    return (
        Membership.objects.filter(project=project)
        .select_related("user")
        .order_by(-rank, "user__username")
    )


def project_counts(*, project: Project) -> dict[str, int]:
    """What the project holds, for its overview: datasets, base models, runs (not archived) and how many
    of them are queued or running, review campaigns."""
    from webapp.runs.models import ACTIVE_STATUSES

    runs = project.runs.filter(archived=False)
    return {
        "datasets": project.datasets.count(),
        "base_models": project.base_models.count(),
        "runs": runs.count(),
        "active_runs": runs.filter(status__in=ACTIVE_STATUSES).count(),
        "campaigns": project.review_campaigns.count(),
    }


# How much of each kind of recent work the overview lists.
OVERVIEW_RUNS = 6
OVERVIEW_VERSIONS = 5
OVERVIEW_CAMPAIGNS = 3


def project_overview(*, project: Project) -> dict[str, list]:
    """The project page's lists of what happens in it: its runs, those queued or running first, then the
    newest (``OVERVIEW_RUNS``); its newest dataset versions; its review campaigns still taking reviews,
    with their progress. A few queries whatever the project holds."""
    from webapp.datasets.models import DatasetVersion
    from webapp.review.models import CampaignStatus
    from webapp.review.selectors import campaign_list
    from webapp.runs.models import ACTIVE_STATUSES

    active_first = Case(When(status__in=ACTIVE_STATUSES, then=Value(0)), default=Value(1), output_field=IntegerField())
    runs = (project.runs.filter(archived=False).select_related("created_by", "base_model", "source_run")
            .order_by(active_first, "-created_at")[:OVERVIEW_RUNS])
    versions = (DatasetVersion.objects.filter(dataset__project=project).select_related("dataset", "created_by")
                .order_by("-created_at")[:OVERVIEW_VERSIONS])
    campaigns = (campaign_list(project=project).exclude(status=CampaignStatus.FAILED)
                 .filter(~Q(status=CampaignStatus.READY) | Q(item_complete__lt=F("item_total")))[:OVERVIEW_CAMPAIGNS])
    return {"runs": list(runs), "versions": list(versions), "campaigns": list(campaigns)}
