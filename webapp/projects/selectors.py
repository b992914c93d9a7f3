"""Reads of projects and memberships for pages."""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Case, Count, F, IntegerField, OuterRef, Q, QuerySet, Subquery, Value, When

from webapp.core.bidi import isolated
from webapp.projects.models import ROLE_RANK, Membership, Project, Role


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
    of them are queued or running, evaluations, review campaigns."""
    from webapp.runs.models import ACTIVE_STATUSES

    runs = project.runs.filter(archived=False)
    return {
        "datasets": project.datasets.count(),
        "base_models": project.base_models.count(),
        "runs": runs.count(),
        "active_runs": runs.filter(status__in=ACTIVE_STATUSES).count(),
        "evaluations": project.evaluations.count(),
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
    # series_cache, a run's downsampled series (the buckets a running run's writer keeps, the series a finished
    # one keeps for the compare page: most of a megabyte each), is no part of the list: read, it made the page
    # wait about 0.7 s at six runs of ten metrics.
    runs = (project.runs.filter(archived=False).select_related("created_by", "base_model", "source_run")
            .defer("series_cache", "source_run__series_cache").order_by(active_first, "-created_at")[:OVERVIEW_RUNS])
    versions = (DatasetVersion.objects.filter(dataset__project=project).select_related("dataset", "created_by")
                .order_by("-created_at")[:OVERVIEW_VERSIONS])
    campaigns = (campaign_list(project=project).exclude(status__in=(CampaignStatus.FAILED, CampaignStatus.CANCELLED))
                 .filter(~Q(status=CampaignStatus.READY) | Q(item_complete__lt=F("item_total")))[:OVERVIEW_CAMPAIGNS])
    return {"runs": list(runs), "versions": list(versions), "campaigns": list(campaigns)}


def may_create_project(*, user: AbstractBaseUser) -> bool:
    """Whether ``user`` may create a project: anyone signed in, unless ``TEMPER_PROJECT_CREATORS`` is ``staff``
    (then staff accounts and superusers: the admin site's *Staff status*)."""
    return settings.TEMPER_PROJECT_CREATORS == "everyone" or user.is_staff or user.is_superuser


def may_delete_project(*, membership: Membership) -> bool:
    """Only an owner may delete a project: it takes every member's work with it."""
    return membership.can(Role.OWNER)


def project_readers(*, project: Project) -> list[str]:
    """Work in flight in ``project`` (what deleting it would pull from under a worker), one sentence each:
    runs queued or running, running pipelines, review campaigns loading or generating (or cancelled while the
    serve worker still answers them) and exports of them being written, serving copies (a run's first one too)
    and checkpoint exports being written, chat and arena answers being written, /v1 completions being answered,
    evaluations queued or running. A dataset version being checked holds nothing: its
    check drops the result of a deleted one."""
    # Imported here: these apps' models import this one's.
    from webapp.chat.models import Message, MessageStatus
    from webapp.chat.selectors import api_generations_answered
    from webapp.chat.services import answer_is_lost
    from webapp.evals.selectors import project_evaluation_readers
    from webapp.review.models import Campaign, CampaignStatus, Export, ExportStatus
    from webapp.review.selectors import stopping_generations
    from webapp.runs.models import (ACTIVE_STATUSES, CheckpointExport, CheckpointExportStatus, Pipeline,
                                    PipelineStatus, Run, RunStatus, ServingCopy, ServingCopyStatus)
    from webapp.runs.selectors import serving_copy_being_written

    readers = []
    for run in Run.objects.filter(project=project, status__in=ACTIVE_STATUSES).order_by("created_at"):
        readers.append(f"run {isolated(run.name)} ({run.public_id}) is {run.status}; cancel it and wait for it to stop")
    for pipeline in Pipeline.objects.filter(project=project, status=PipelineStatus.RUNNING).order_by("created_at"):
        readers.append(f"pipeline {isolated(pipeline.name)} is running; cancel it or wait for it to finish")
    busy = Campaign.objects.filter(project=project, status__in=(CampaignStatus.LOADING, CampaignStatus.GENERATING))
    for campaign in busy.order_by("created_at"):
        readers.append(f"review campaign {isolated(campaign.name)} is {campaign.get_status_display().lower()}; wait "
                       "until it is ready")
    for campaign in stopping_generations(project_id=project.pk):
        readers.append(f"review campaign {isolated(campaign.name)} was cancelled, but the serve worker is still "
                       "answering the prompts under way; try again in a moment, once it has stopped")
    for export in Export.objects.filter(campaign__project=project, status=ExportStatus.WRITING).select_related(
            "campaign"):
        readers.append(f"an export of review campaign {isolated(export.campaign.name)} is being written; wait until it is done")
    if ServingCopy.objects.filter(project=project, status=ServingCopyStatus.WRITING).exists():
        readers.append("a serving copy is being written; wait until it is ready")
    # A run's first copy, written by a serve worker when it succeeded, has no row.
    for run in Run.objects.filter(project=project, status=RunStatus.SUCCEEDED, serving_copies__isnull=True):
        if serving_copy_being_written(run=run):
            readers.append(f"the serving copy of run {isolated(run.name)} ({run.public_id}) is being written; wait "
                           "until it is ready")
    if CheckpointExport.objects.filter(run__project=project, status=CheckpointExportStatus.EXPORTING).exists():
        readers.append("a checkpoint is being exported; wait until it is done")
    streaming = Message.objects.filter(conversation__project=project, status=MessageStatus.STREAMING)
    if any(not answer_is_lost(message) for message in streaming):
        readers.append("a chat or arena answer is still being written; wait for it to finish")
    if api_generations_answered(project_id=project.pk).exists():
        readers.append("a /v1 completion is being answered; wait for it to finish")
    readers.extend(project_evaluation_readers(project=project))
    return readers
