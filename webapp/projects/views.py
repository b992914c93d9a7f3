"""Project pages: the project list (home), project creation, the overview, the settings (name, description and,
in its danger zone, the deletion) and the members page. Every project-scoped view starts with ``get_project_for_user``."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from webapp.basemodels import selectors as basemodel_selectors
from webapp.core.bidi import isolated
from webapp.core.forms import add_service_errors
from webapp.core.submissions import deleted_once_or_refused, form_send_once, sent_once_or_refused
from webapp.projects import selectors, services
from webapp.projects.storage import project_storage, prune_skipped_runs
from webapp.projects.access import get_project_for_user
from webapp.projects.forms import (MemberAddForm, MemberRemoveForm, MemberRoleForm, ProjectCreateForm,
                                   ProjectSettingsForm)
from webapp.projects.models import Membership, Project, Role
from webapp.runs import services as run_services


@login_required
@require_http_methods(["GET"])
def project_list(request: HttpRequest) -> HttpResponse:
    projects = selectors.project_list_for_user(user=request.user)
    return render(request, "projects/list.html", {
        "projects": projects, "may_create": selectors.may_create_project(user=request.user)})


@login_required
@require_http_methods(["GET", "POST"])
def project_create(request: HttpRequest) -> HttpResponse:
    if not selectors.may_create_project(user=request.user):
        raise PermissionDenied("Only staff may create projects on this Temper (TEMPER_PROJECT_CREATORS=staff): ask an "
                               "administrator to create it and make you its owner.")
    form = ProjectCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        def create() -> str:
            project = services.project_create(
                name=form.cleaned_data["name"], slug=form.cleaned_data["slug"], owner=request.user
            )
            messages.success(request, f"Project {isolated(project.name)} created.")
            return reverse("projects:detail", args=[project.slug])

        try:
            return redirect(form_send_once(request, create=create))
        except ValidationError as error:
            add_service_errors(form, error)
    status = 400 if form.errors else 200
    return render(request, "projects/create.html", {"form": form}, status=status)


@login_required
@require_http_methods(["GET"])
def project_detail(request: HttpRequest, slug: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug)
    overview, can_act = selectors.project_overview(project=project), membership.can(Role.MEMBER)
    return render(
        request,
        "projects/detail.html",
        {
            "project": project,
            "membership": membership,
            "members": selectors.membership_list(project=project),
            "counts": selectors.project_counts(project=project),
            "overview": overview,
            "can_act": can_act,
            "can_upload_model": membership.can(Role.OWNER),
            # Getting started (no run yet) opens the launch form on it, which starts from its own preset there.
            "demo_model": basemodel_selectors.demo_model(project=project) if can_act and not overview["runs"] else None,
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def project_settings(request: HttpRequest, slug: str) -> HttpResponse:
    """Owners rename the project and describe it (``services.project_update``; the slug stays), and delete it from
    the page's danger zone; members and viewers get 403 as on the other owner pages. A refusal names the field and
    keeps what was typed."""
    project, membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    form = ProjectSettingsForm(request.POST or None,
                               initial={"name": project.name, "description": project.description})
    if request.method == "POST" and form.is_valid():
        try:
            project = services.project_update(project=project, user=request.user, **form.cleaned_data)
        except ValidationError as error:
            add_service_errors(form, error)
        else:
            messages.success(request, f"Saved the settings of {isolated(project.name)}.")
            return redirect("projects:settings", project.slug)
    return render(request, "projects/settings.html", {"project": project, "membership": membership, "form": form},
                  status=400 if form.errors else 200)


@login_required
@require_POST
def project_delete(request: HttpRequest, slug: str) -> HttpResponse:
    """Delete a project, its slug typed to confirm; refused back on its settings page, saying what is still at
    work."""
    def delete() -> str:  # only looked up here: a second click, finding it gone, lands where the first did
        project, membership = get_project_for_user(request.user, slug)
        if not selectors.may_delete_project(membership=membership):
            raise PermissionDenied("only an owner may delete a project")
        services.project_delete(project=project, confirmation=request.POST.get("confirm_slug", ""))
        messages.success(request, f"Deleted the project {isolated(project.name)} ({project.slug}) with everything "
                                  "in it.")
        return reverse("projects:list")

    return redirect(deleted_once_or_refused(request, delete=delete, back=reverse("projects:settings", args=[slug])))


def _render_members(request, project: Project, membership: Membership, *, add_form=None, status=200):
    return render(
        request,
        "projects/members.html",
        {
            "project": project,
            "membership": membership,
            "members": selectors.membership_list(project=project),
            "add_form": add_form or MemberAddForm(),
            "roles": Role.choices,
            "is_owner": membership.can(Role.OWNER),
        },
        status=status,
    )


@login_required
@require_http_methods(["GET", "POST"])
def members(request: HttpRequest, slug: str) -> HttpResponse:
    """Lists the members; a POST (owners only) adds one by username."""
    if request.method == "GET":
        project, membership = get_project_for_user(request.user, slug)
        return _render_members(request, project, membership)
    project, membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    form = MemberAddForm(request.POST)
    if form.is_valid():
        try:
            services.membership_add(
                project=project, user=form.cleaned_data["user"], role=form.cleaned_data["role"], actor=request.user
            )
        except ValidationError as error:
            add_service_errors(form, error)
        else:
            messages.success(request, f"{isolated(form.cleaned_data['username'])} added as {form.cleaned_data['role']}.")
            return redirect("projects:members", project.slug)
    return _render_members(request, project, membership, add_form=form, status=400)


def _target_membership(project: Project, username: str) -> Membership:
    """The membership an owner's change is for. Its absence is a refusal on the members page, not a 404: the
    owner's page may list someone another owner has removed since."""
    target = Membership.objects.select_related("user", "project").filter(
        project=project, user__username=username
    ).first()
    if target is None:
        raise ValidationError({"username": f"{username} is not a member of {isolated(project.name)}: an owner may "
                                           "have removed them since this page was shown; nothing changed"})
    return target


def _members_change_refused(request, project, form_errors) -> HttpResponse:
    """Back to the members page with why: the change and removal forms live in its table, so a page
    rendered at their POST address would be one that a reload sends again and a link cannot reach."""
    for messages_for_field in form_errors.values():
        for message in messages_for_field:
            messages.error(request, message)
    return redirect("projects:members", project.slug)


@login_required
@require_POST
def member_set_role(request: HttpRequest, slug: str) -> HttpResponse:
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        return _members_change_refused(request, project, form.errors)
    try:
        target = _target_membership(project, form.cleaned_data["username"])
        services.membership_set_role(membership=target, role=form.cleaned_data["role"], actor=request.user)
    except ValidationError as error:
        return _members_change_refused(request, project, error.message_dict)
    messages.success(request, f"{isolated(target.user.get_username())} is now {target.role}.")
    return redirect("projects:members", project.slug)


@login_required
@require_POST
def member_remove(request: HttpRequest, slug: str) -> HttpResponse:
    """Owners remove members; any member may leave (remove themselves), the last owner excepted."""
    project, membership = get_project_for_user(request.user, slug)
    form = MemberRemoveForm(request.POST)
    leaving = form.is_valid() and form.cleaned_data["username"] == request.user.get_username()
    if not leaving and not membership.can(Role.OWNER):
        raise PermissionDenied(f"only owners remove members of {project.slug}; you may leave it yourself")
    if not form.is_valid():
        return _members_change_refused(request, project, form.errors)
    try:
        target = _target_membership(project, form.cleaned_data["username"])
        services.membership_remove(membership=target, actor=request.user)
    except ValidationError as error:
        return _members_change_refused(request, project, error.message_dict)
    if target.user_id == request.user.id:
        messages.success(request, f"You left {isolated(project.name)}.")
        return redirect("projects:list")
    messages.success(request, f"{isolated(target.user.get_username())} removed from {isolated(project.name)}.")
    return redirect("projects:members", project.slug)


@login_required
@require_http_methods(["GET"])
def storage(request: HttpRequest, slug: str) -> HttpResponse:
    """What the project's runs, datasets and base models take on disk, measured now; every member may read it."""
    project, membership = get_project_for_user(request.user, slug)
    return render(request, "projects/storage.html", {
        "project": project, "membership": membership, "storage": project_storage(project=project),
        "can_prune": membership.can(Role.OWNER), **_prune_context(project)})


@login_required
@require_http_methods(["GET"])
def storage_prune_state(request: HttpRequest, slug: str) -> HttpResponse:
    """The Storage page's project-wide prune, under way or its outcome (the partial static/serving_copy.js asks for
    again while it runs); every member may read it."""
    project, _membership = get_project_for_user(request.user, slug)
    return render(request, "projects/_storage_prune.html", {"project": project, **_prune_context(project)})


def _prune_context(project: Project) -> dict:
    prune = run_services.project_prune_latest(project=project)
    return {"prune": prune, "prune_running": bool(prune and run_services.project_prune_is_running(prune))}


@login_required
@require_POST
def storage_prune(request: HttpRequest, slug: str) -> HttpResponse:
    """Queue the pruning of the checkpoints of every run of the project that has ended (owners): each keeps its
    newest and its best (``run_services.project_checkpoints_prune``, a task: hundreds of runs take seconds); back to
    the Storage page, which follows its progress, saying so and which active runs it skips, or why it was refused
    (another prune of the project under way)."""
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    page = reverse("projects:storage", args=[project.slug])

    def prune() -> str:
        run_services.project_checkpoints_prune_request(project=project, user=request.user)
        messages.success(request, "Pruning the checkpoints of this project's ended runs in the background: each "
                                  "keeps its newest and its best. This page shows how far it has gone.")
        if skipped := prune_skipped_runs(project=project):
            names = ", ".join(f"{isolated(run.name)} ({run.public_id})" for run in skipped)
            messages.info(request, f"Skipped, still active: {names}. Prune them once they have ended.")
        return page

    return redirect(sent_once_or_refused(request, create=prune, back=page))
