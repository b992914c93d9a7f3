"""The project's Activity page: its log, newest first, a page at a time, by person, what was done and kind of
object."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from webapp.activity import selectors
from webapp.activity.models import TargetKind
from webapp.api import paging
from webapp.projects.access import get_project_for_user

ENTRIES_PER_PAGE = 50
PAGE_SORT = "activity"


@login_required
@require_GET
def activity_list(request: HttpRequest, slug: str) -> HttpResponse:
    """Every member (viewers too) reads the whole log; outsiders get 404. A target links to its page only for those
    who may open it (a webhook: owners)."""
    project, membership = get_project_for_user(request.user, slug)
    context = {"project": project, "membership": membership, "kinds": TargetKind.choices,
               "actors": selectors.activity_actors(project=project), "actor": request.GET.get("actor", ""),
               "actions": selectors.ACTIONS, "action": request.GET.get("action", ""),
               "kind": request.GET.get("kind", ""), "rows": [], "next_url": None,
               "show_newest": bool(request.GET.get("cursor"))}
    try:
        filters = selectors.ActivityFilters.from_query(request.GET)
        asked = paging.page_query(request, sort=PAGE_SORT, default_limit=ENTRIES_PER_PAGE,
                                  max_limit=paging.MAX_LIMIT)
    except ValidationError as error:
        return render(request, "activity/list.html", {**context, "errors": error.messages}, status=400)
    page = selectors.activity_page(project=project, filters=filters, after=asked.after, limit=asked.limit)
    return render(request, "activity/list.html", {
        **context, "rows": selectors.activity_rows(project=project, entries=page.rows,
                                                                 role=membership.role),
        "next_url": paging.next_link(request, sort=PAGE_SORT, after=page.next_after)})
