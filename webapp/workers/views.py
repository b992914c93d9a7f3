"""The Workers page. Workers are shared infrastructure, not project objects: every
logged-in user may see them (host names, queues, devices, what each is doing); what a job works on is
named only to members of its project (``selectors.current_jobs_shown``)."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from webapp.core.disk_free import data_filesystems
from webapp.workers import selectors
from webapp.workers.models import stale_after


@login_required
@require_http_methods(["GET"])
def worker_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "workers/list.html",
        {"workers": selectors.worker_list(viewer=request.user), "stale_after_seconds": int(stale_after().total_seconds()),
         "filesystems": data_filesystems()},
    )
