"""Base model pages: list, register, upload (an owner's archive), detail, unregister (project-scoped)."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_http_methods, require_POST

from webapp.basemodels import inspection, selectors, services, uploads
from webapp.basemodels.forms import BaseModelRegisterForm, BaseModelUploadForm
from webapp.core.bidi import isolated
from webapp.core.forms import add_service_errors
from webapp.core.numbers import whole_number
from webapp.core.submissions import deleted_once_or_refused, form_send_once, sent_once_or_refused
from webapp.datasets.models import DatasetVersion
from webapp.core.disk_free import upload_room_refusal
from webapp.datasets.uploads import LimitedUploadHandler, body_too_large, name_as_uploaded, upload_cut_short_message
from webapp.projects.access import get_project_for_user
from webapp.projects.models import Role
from webapp.runs import serving_copies


BASE_MODELS_PER_PAGE = 50


@login_required
@require_http_methods(["GET"])
def basemodel_list(request: HttpRequest, slug: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug)
    # Paged as the datasets and runs are: unpaged, 100 models took 20 ms of template a load (bench/pages_at_scale.py).
    page = Paginator(selectors.basemodel_list(project=project), BASE_MODELS_PER_PAGE).get_page(
        whole_number(request.GET.get("page")))
    return render(
        request,
        "basemodels/list.html",
        {
            "project": project,
            "membership": membership,
            "base_models": page.object_list,
            "page": page,
            "can_register": membership.can(Role.MEMBER),
            "can_upload": membership.can(Role.OWNER),
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def basemodel_register(request: HttpRequest, slug: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    # A directory chosen among those found below comes as ?path=.
    form = BaseModelRegisterForm(request.POST or None, initial={"path": request.GET.get("path", "")})
    if request.method == "POST" and form.is_valid():
        def register() -> str:
            base_model = services.basemodel_register(
                project=project, name=form.cleaned_data["name"], path=form.cleaned_data["path"], user=request.user
            )
            messages.success(request, f"Base model {isolated(base_model.name)} registered.")
            return reverse("basemodels:detail", args=[project.slug, base_model.public_id])

        try:
            return redirect(form_send_once(request, create=register))
        except ValidationError as error:
            add_service_errors(form, error)
    return render(
        request,
        "basemodels/register.html",
        {
            "project": project,
            "membership": membership,
            "form": form,
            "models_root": settings.MODELS_ROOT,
            "own_folder": inspection.project_folder(models_root=settings.MODELS_ROOT.resolve(), project_slug=project.slug),
            "shared_folder": settings.MODELS_ROOT.resolve() / inspection.SHARED_FOLDER,
            "candidates": selectors.register_candidates(project=project, models_root=settings.MODELS_ROOT),
        },
        status=400 if form.errors else 200,
    )


@csrf_exempt  # checked by _upload_checked, once the upload handler is set: reading the token reads the body
@login_required
@require_http_methods(["GET", "POST"])
def basemodel_upload(request: HttpRequest, slug: str) -> HttpResponse:
    """An owner uploads a model archive, unpacked into the project's own folder and registered
    (``uploads.basemodel_upload``): it writes under the models root, which a member's registration never does."""
    project, membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    limit = settings.TEMPER_MODEL_UPLOAD_MAX_BYTES
    handler = None
    if request.method == "POST":
        if body_too_large(request.META.get("CONTENT_LENGTH"), max_upload_bytes=limit):
            return _render_upload(request, project, membership, BaseModelUploadForm(),
                                  error=uploads.archive_too_large_message(limit), status=413)  # the form stays unbound
        if refusal := upload_room_refusal(request.META.get("CONTENT_LENGTH"), destination=settings.MODELS_ROOT,
                                          unpacked=True):
            return _render_upload(request, project, membership, BaseModelUploadForm(), error=refusal, status=507)
        handler = LimitedUploadHandler(request, max_bytes=limit)
        request.upload_handlers = [handler]
    return _upload_checked(request, project, membership, handler)


@csrf_protect
def _upload_checked(request, project, membership, handler: LimitedUploadHandler | None) -> HttpResponse:
    if request.method == "GET":
        return _render_upload(request, project, membership, BaseModelUploadForm())
    form = BaseModelUploadForm(request.POST, request.FILES)
    if handler is not None and handler.exceeded:
        form.is_valid()  # cleans the other fields, so that add_error may add to them
        form.add_error("archive", uploads.archive_too_large_message(handler.max_bytes))
        return _render_upload(request, project, membership, form, status=413)
    if handler is not None and handler.disk_full:
        form.is_valid()
        form.errors.pop("archive", None)  # "This field is required.": it was sent, and dropped
        form.add_error("archive", handler.disk_full)
        return _render_upload(request, project, membership, form, status=507)
    if handler is not None and handler.cut_short is not None:
        form.is_valid()
        form.errors.pop("archive", None)  # "This field is required.": it was sent, and cut short
        form.add_error("archive", upload_cut_short_message(handler.cut_short))
        return _render_upload(request, project, membership, form, status=400)
    if form.is_valid():
        archive = form.cleaned_data["archive"]
        archive_name = name_as_uploaded(archive.name)

        def page_of(base_model) -> str:
            messages.success(request, f"Unpacked {isolated(archive_name)} into {base_model.path} and registered it "
                                      f"as {isolated(base_model.name)}.")
            return reverse("basemodels:detail", args=[project.slug, base_model.public_id])

        try:
            # The archive is told by its name, size and ends, not read whole (a 20 GB one took minutes to hash).
            return redirect(uploads.basemodel_upload_once(
                project=project, name=form.cleaned_data["name"], archive=Path(archive.temporary_file_path()),
                archive_name=archive_name, user=request.user, made=page_of,
                send_once=lambda create, prepare: form_send_once(request, create=create, prepare=prepare,
                                                                 sample_files=True)))
        except ValidationError as error:
            add_service_errors(form, error)
    return _render_upload(request, project, membership, form, status=400)


def _render_upload(request, project, membership, form, *, error: str | None = None, status: int = 200) -> HttpResponse:
    return render(request, "basemodels/upload.html", {
        "project": project, "membership": membership, "form": form, "upload_error": error,
        "own_folder": inspection.project_folder(models_root=settings.MODELS_ROOT.resolve(), project_slug=project.slug),
        "max_upload_bytes": settings.TEMPER_MODEL_UPLOAD_MAX_BYTES,
    }, status=status)


@login_required
@require_http_methods(["GET"])
def basemodel_detail(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug)
    base_model = selectors.basemodel_get(project=project, public_id=public_id)
    root = settings.MODELS_ROOT.resolve()
    context = _serving_copy_context(project, membership, base_model)
    # Not of a folder the project may not read: its README.md or files may be another project's.
    licence = None if context["refusal"] else selectors.base_model_licence(base_model=base_model)
    return render(request, "basemodels/detail.html", {
        **context, "licence": licence, "shared_folder": root / inspection.SHARED_FOLDER,
        "own_folder": inspection.project_folder(models_root=root, project_slug=project.slug)})


def _serving_copy_context(project, membership, base_model) -> dict:
    can_act = membership.can(Role.MEMBER)
    return {"project": project, "membership": membership, "base_model": base_model, "can_act": can_act,
            "refusal": selectors.base_model_refusal(base_model=base_model),
            "can_delete": selectors.may_unregister_base_model(membership=membership, base_model=base_model),
            "can_delete_files": selectors.may_delete_base_model_files(membership=membership, base_model=base_model),
            "serving_copy": serving_copies.base_model_serving_copy(base_model=base_model),
            "eval_versions": serving_copies.eval_version_choices(project=project) if can_act else None}


@login_required
@require_POST
def basemodel_delete(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    """Unregister a base model: its row and serving copies go; its directory stays (it is the user's), unless an
    owner ticked ``delete_files`` for a model Temper unpacked itself (``services.basemodel_unregister``)."""
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    listed = reverse("basemodels:list", args=[project.slug])
    delete_files = request.POST.get("delete_files") == "1"

    def delete() -> str:  # looked up here: a second click finds it gone and lands where the first did
        base_model = selectors.basemodel_get(project=project, public_id=public_id)
        selectors.ensure_may_unregister_base_model(membership=membership, base_model=base_model)
        if delete_files:
            selectors.ensure_may_delete_base_model_files(membership=membership)
        removal = services.basemodel_unregister(base_model=base_model, delete_files=delete_files,
                                                      actor=request.user)
        name = isolated(base_model.name)
        if removal is None:
            messages.success(request, f"Unregistered the base model {name}; its directory {base_model.path} is left "
                                      "as it was.")
        else:  # said once committed, when the folder has gone (or failed to)
            transaction.on_commit(lambda: _removal_said(request, name, removal))
        return listed

    return redirect(deleted_once_or_refused(request, delete=delete, gone=listed,
                                            back=reverse("basemodels:detail", args=[project.slug, public_id])))


def _removal_said(request: HttpRequest, name: str, removal: services.FolderRemoval) -> None:
    if removal.removed:
        messages.success(request, f"Unregistered the base model {name} and deleted its folder {removal.path}; the "
                                  "name is free for a new upload.")
    else:
        messages.warning(request, f"Unregistered the base model {name}, but its folder {removal.path} could not be "
                                  f"deleted ({removal.error}); ask an administrator to remove it.")


@login_required
@require_http_methods(["GET", "POST"])
def basemodel_serving_copy(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    """GET: the serving copy card (the page asks for it again while the copy is being written). POST (member):
    make the copy (``scheme`` int8 or int4, measured on ``eval_version`` when one is chosen), once per
    sending; asked again while it is being written, nothing more is queued."""
    project, membership = get_project_for_user(
        request.user, slug, min_role=Role.MEMBER if request.method == "POST" else Role.VIEWER)
    base_model = selectors.basemodel_get(project=project, public_id=public_id)
    if request.method == "GET":
        return render(request, "basemodels/_serving_copy.html", _serving_copy_context(project, membership, base_model))
    page = reverse("basemodels:detail", args=[project.slug, base_model.public_id])

    def make() -> str:
        version_id = request.POST.get("eval_version", "")
        eval_version = (DatasetVersion.objects.filter(dataset__project=project, public_id=version_id).first()
                        if version_id else None)
        if version_id and eval_version is None:
            raise ValidationError({"eval_version": "choose a ready dataset version of this project"})
        copy, queued = serving_copies.serving_copy_request(
            project=project, user=request.user, base_model=base_model, scheme=request.POST.get("scheme", "int8"),
            eval_version=eval_version)
        messages.add_message(request, *serving_copies.request_message(
            copy, queued, of=isolated(base_model.name), meanwhile="the unquantized model"))
        return page

    return redirect(sent_once_or_refused(request, create=make, back=page))
