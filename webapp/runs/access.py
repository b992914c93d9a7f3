"""The one way to look up a run for a request: through its project's membership
(``get_project_for_user``), so outsiders get 404 for every run page and endpoint, and viewers,
who may read, get 403 for anything that launches, cancels or changes a run."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.http import Http404
from django.urls import reverse

from webapp.projects.access import get_project_for_user
from webapp.projects.models import Membership, Project, Role
from webapp.runs.models import Run


def get_run_for_user(user: AbstractBaseUser | AnonymousUser, project_slug: str, run_id: str, *,
                     write: bool = False, series_cache: bool = True) -> tuple[Project, Membership, Run]:
    """``(project, membership, run)`` for run ``run_id`` of project ``project_slug``.

    404 when the user is not a member or the run is not the project's; 403 for a viewer when
    ``write`` (launch, cancel, resume, retry, edit). ``series_cache=False`` leaves the run's
    ``series_cache`` to be read only if it is used (a query then)."""
    project, membership = get_project_for_user(user, project_slug, min_role=Role.MEMBER if write else Role.VIEWER)
    # The run it started from is named and linked, never drawn: its series_cache (most of a megabyte) stays unread.
    deferred = ["source_run__series_cache"] if series_cache else ["source_run__series_cache", "series_cache"]
    run = (Run.objects.select_related("project", "base_model", "source_run", "created_by", "pipeline")
           .defer(*deferred).filter(project=project, public_id=run_id).first())
    if run is None:
        # Only a member gets this far: the log's address tells them nothing an outsider could learn.
        # The pages and the REST API share this 404: it names the log's page and its API address both.
        page, api = reverse("activity:list", args=[project.slug]), reverse("api:activity", args=[project.slug])
        raise Http404(f"no such run in this project: if it was deleted, the project's activity log says who deleted "
                      f"it and when (its Activity page, {page}, or GET {api}?kind=run&action=deleted)")
    return project, membership, run
