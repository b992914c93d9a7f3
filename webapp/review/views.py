"""Review pages: campaigns (list, create, settings), the reviewing page, items, conflicts, export.

Everyone in the project reads campaigns and their figures; only a campaign's reviewers (members or
owners) review; owners create campaigns, change them, resolve conflicts and export. Every view
starts with ``get_project_for_user``, so outsiders get 404. Dataset and review text is rendered by
autoescaped templates; only the guidelines are HTML, made by ``render_markdown`` (sanitized).
"""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.core.forms import add_service_errors
from webapp.projects.access import get_project_for_user
from webapp.projects.models import Role
from webapp.review import selectors, services
from webapp.review.forms import CampaignCreateForm, CampaignSettingsForm, ExportForm, ResolveForm, ReviewForm
from webapp.review.models import CampaignStatus, ExportStatus, ItemStatus
from webapp.runs.markup import render_markdown

ITEMS_PER_PAGE = 50


@login_required
@require_http_methods(["GET"])
def campaign_list(request: HttpRequest, slug: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug)
    return render(request, "review/list.html", {
        "project": project, "membership": membership, "campaigns": selectors.campaign_list(project=project),
        "can_manage": membership.can(Role.OWNER),
    })


@login_required
@require_http_methods(["GET", "POST"])
def campaign_create(request: HttpRequest, slug: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    form = CampaignCreateForm(request.POST or None, project=project)
    if request.method == "POST" and form.is_valid():
        try:
            campaign = services.campaign_create(
                project=project, name=form.cleaned_data["name"], guidelines=form.cleaned_data["guidelines"],
                required_reviews=form.cleaned_data["required_reviews"], reviewers=form.cleaned_data["reviewers"],
                source_version=form.cleaned_data["source_version"], user=request.user)
        except ValidationError as error:
            add_service_errors(form, error)
        else:
            messages.success(request, f"Campaign {campaign.name} created; its items are loading from "
                                      f"{campaign.source_version}.")
            return redirect("review:detail", project.slug, campaign.public_id)
    return render(request, "review/create.html", {"project": project, "membership": membership, "form": form},
                  status=400 if request.method == "POST" else 200)


@login_required
@require_http_methods(["GET"])
def campaign_detail(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug)
    campaign = selectors.campaign_get(project=project, public_id=public_id)
    can_manage = membership.can(Role.OWNER)
    exports = list(selectors.export_list(campaign=campaign))
    return render(request, "review/detail.html", {
        "project": project, "membership": membership, "campaign": campaign,
        "guidelines_html": render_markdown(campaign.guidelines),
        "progress": selectors.campaign_progress(campaign=campaign),
        "report": selectors.campaign_agreement(campaign=campaign),
        "reviewers": selectors.reviewer_names(campaign=campaign),
        "is_reviewer": selectors.is_reviewer(campaign=campaign, user=request.user),
        "my_done": selectors.reviewer_done(campaign=campaign, user=request.user),
        "exports": exports,
        "can_manage": can_manage,
        "refreshing": campaign.status == CampaignStatus.LOADING or any(
            export.status == ExportStatus.WRITING for export in exports),
        "export_form": ExportForm(initial={"dataset_name": f"{campaign.name} reviewed"}) if can_manage else None,
    })


@login_required
@require_http_methods(["GET", "POST"])
def campaign_settings(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    campaign = selectors.campaign_get(project=project, public_id=public_id)
    initial = {"guidelines": campaign.guidelines, "required_reviews": campaign.required_reviews,
               "reviewers": list(campaign.reviewers.all())}
    form = CampaignSettingsForm(request.POST or None, project=project, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            services.campaign_update(campaign=campaign, guidelines=form.cleaned_data["guidelines"],
                                     required_reviews=form.cleaned_data["required_reviews"],
                                     reviewers=form.cleaned_data["reviewers"])
        except ValidationError as error:
            add_service_errors(form, error)
        else:
            messages.success(request, "Campaign settings saved.")
            return redirect("review:detail", project.slug, campaign.public_id)
    return render(request, "review/settings.html",
                  {"project": project, "membership": membership, "campaign": campaign, "form": form},
                  status=400 if request.method == "POST" else 200)


@login_required
@require_POST
def campaign_load(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    """Queue a loading campaign's items again (e.g. Redis was down when it was created)."""
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    campaign = selectors.campaign_get(project=project, public_id=public_id)
    try:
        services.campaign_load_request(campaign=campaign)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, "Loading the items again.")
    return redirect("review:detail", project.slug, campaign.public_id)


@login_required
@require_http_methods(["GET", "POST"])
def review_next(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    """GET: the next item of the reviewer's queue. POST: their answer to an item, then the next one."""
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    campaign = selectors.campaign_get(project=project, public_id=public_id)
    if request.method == "POST":
        form = ReviewForm(request.POST)
        if form.is_valid():
            item = selectors.item_get(campaign=campaign, public_id=form.cleaned_data["item"])
            editing = "edited_first" in request.POST or "edited_second" in request.POST
            try:
                services.review_submit(
                    item=item, user=request.user, choice=form.cleaned_data["choice"],
                    edited_first=form.cleaned_data["edited_first"] if "edited_first" in request.POST else None,
                    edited_second=form.cleaned_data["edited_second"] if "edited_second" in request.POST else None,
                    comment=form.cleaned_data["comment"])
            except ValidationError as error:
                messages.error(request, " ".join(error.messages))
            else:
                messages.success(request, f"Item {item.sequence} {'edited and ' if editing else ''}recorded.")
        else:
            messages.error(request, "That answer was incomplete; answer the item again.")
        return redirect("review:next", project.slug, campaign.public_id)
    item = services.queue_next_item(campaign=campaign, user=request.user)
    context = {"project": project, "membership": membership, "campaign": campaign, "item": item,
               "guidelines_html": render_markdown(campaign.guidelines), "loading": campaign.status != CampaignStatus.READY,
               "my_done": selectors.reviewer_done(campaign=campaign, user=request.user)}
    if item is not None:
        shown_first = services.shown_first_for(item_public_id=item.public_id, user_id=request.user.pk)
        first, second = ((item.response_a, item.response_b) if shown_first == "a"
                         else (item.response_b, item.response_a))
        context.update(
            prompt=selectors.as_display(item.prompt),
            first=selectors.as_display(first), second=selectors.as_display(second),
            first_text=services.editable_text(first), second_text=services.editable_text(second),
        )
    return render(request, "review/review.html", context)


@login_required
@require_http_methods(["GET"])
def item_list(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug)
    campaign = selectors.campaign_get(project=project, public_id=public_id)
    status = request.GET.get("status") if request.GET.get("status") in ItemStatus.values else None
    page = Paginator(selectors.item_list(campaign=campaign, status=status), ITEMS_PER_PAGE).get_page(
        request.GET.get("page"))
    return render(request, "review/items.html", {
        "project": project, "membership": membership, "campaign": campaign, "page": page,
        "rows": [(item, selectors.preview_text(item.prompt)) for item in page.object_list], "status": status, "statuses": ItemStatus.choices,
    })


@login_required
@require_http_methods(["GET"])
def conflict_list(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    campaign = selectors.campaign_get(project=project, public_id=public_id)
    return render(request, "review/conflicts.html", {
        "project": project, "membership": membership, "campaign": campaign,
        "conflicts": selectors.conflict_entries(campaign=campaign, limit=ITEMS_PER_PAGE),
        "total": selectors.status_counts(campaign=campaign)[ItemStatus.CONFLICT],
    })


@login_required
@require_POST
def conflict_resolve(request: HttpRequest, slug: str, public_id: str, item_id: str) -> HttpResponse:
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    campaign = selectors.campaign_get(project=project, public_id=public_id)
    item = selectors.item_get(campaign=campaign, public_id=item_id)
    form = ResolveForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose the final label: A better, B better, tie or both bad.")
    else:
        try:
            services.conflict_resolve(item=item, label=form.cleaned_data["label"], user=request.user)
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
        else:
            messages.success(request, f"Item {item.sequence} resolved: {form.cleaned_data['label']}.")
    return redirect("review:conflicts", project.slug, campaign.public_id)


@login_required
@require_POST
def export_create(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    campaign = selectors.campaign_get(project=project, public_id=public_id)
    form = ExportForm(request.POST)
    if form.is_valid():
        try:
            export = services.export_create(
                campaign=campaign, user=request.user,
                options=services.ExportOptions(**form.cleaned_data))
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
        else:
            messages.success(request, f"Exporting the complete items to {export.dataset_name}; the new version "
                                      "appears under Exports when it is written.")
    else:
        messages.error(request, "Name the dataset to export to.")
    return redirect("review:detail", project.slug, campaign.public_id)
