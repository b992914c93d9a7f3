"""Dataset pages: list, upload (new dataset or new version), dataset detail, version detail
(status, errors, preview, statistics), the comparison of two versions, download and token statistics.

Viewers read, members upload; every view starts with ``get_project_for_user`` so outsiders get
404. The upload views are CSRF-exempt on the outside only so that they can check access and the
request size and install the size-limited upload handler before the body is parsed; the CSRF
check then runs on the inner view, as Django's documentation prescribes for custom handlers.
"""
from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_http_methods, require_POST

from jaxengine.data import formats
from webapp.basemodels.selectors import basemodel_list
from webapp.core.bidi import isolated
from webapp.core.forms import add_service_errors
from webapp.core.numbers import whole_number
from webapp.core.sse import session_access_lost
from webapp.core.streaming import download_label, file_download
from webapp.core.submissions import deleted_once_or_refused, form_send_once, sent_once_or_refused
from webapp.datasets import selectors, services
from webapp.datasets.forms import (DatasetAboutForm, DecontaminateForm, SplitForm, TokenStatisticsForm, UploadForm,
                                   mapping_field_name)
from webapp.datasets.models import Dataset, VersionStatus
from webapp.core.disk_free import upload_room_refusal
from webapp.datasets.uploads import (LimitedUploadHandler, body_too_large, file_too_large_message,
                                     upload_cut_short_message)
from webapp.evals.services import METRIC_OF_KIND
from webapp.projects.access import get_project_for_user
from webapp.projects.models import Membership, Project, Role
from webapp.review.selectors import export_campaigns
from webapp.workers.selectors import queue_unserved

DATASETS_PER_PAGE = 50


@login_required
@require_http_methods(["GET"])
def dataset_list(request: HttpRequest, slug: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug)
    # Paged so that the page stays fast (bench/pages.py: < 100 ms at p95) however many datasets.
    page = Paginator(selectors.dataset_list(project=project), DATASETS_PER_PAGE).get_page(
        whole_number(request.GET.get("page")))
    return render(
        request,
        "datasets/list.html",
        {
            "project": project,
            "membership": membership,
            "datasets": page.object_list,
            "page": page,
            "can_upload": membership.can(Role.MEMBER),
        },
    )


@csrf_exempt
@login_required
@require_http_methods(["GET", "POST"])
def dataset_upload(request: HttpRequest, slug: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    return _upload(request, project, membership, dataset=None)


@csrf_exempt
@login_required
@require_http_methods(["GET", "POST"])
def version_upload(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    dataset = selectors.dataset_get(project=project, public_id=public_id)
    return _upload(request, project, membership, dataset=dataset)


def _upload(request: HttpRequest, project: Project, membership: Membership, *, dataset: Dataset | None):
    limit = settings.TEMPER_MAX_UPLOAD_BYTES
    handler = None
    if request.method == "POST":
        if body_too_large(request.META.get("CONTENT_LENGTH"), max_upload_bytes=limit):
            return _render_upload(request, project, membership, UploadForm(dataset=dataset), dataset,
                                  error=file_too_large_message(limit), status=413)
        if refusal := upload_room_refusal(request.META.get("CONTENT_LENGTH"), destination=settings.DATA_ROOT):
            return _render_upload(request, project, membership, UploadForm(dataset=dataset), dataset,
                                  error=refusal, status=507)
        handler = LimitedUploadHandler(request, max_bytes=limit)
        request.upload_handlers = [handler]
    return _upload_checked(request, project, membership, dataset, handler)


@csrf_protect
def _upload_checked(request, project, membership, dataset, handler: LimitedUploadHandler | None):
    if request.method == "GET":
        # A new version usually has the columns of the last one: its form starts from that mapping.
        previous = selectors.version_list(dataset=dataset).first() if dataset is not None else None
        initial = {mapping_field_name(field): column for field, column in previous.column_mapping.items()} if previous else {}
        return _render_upload(request, project, membership, UploadForm(dataset=dataset, initial=initial), dataset,
                              mapping_from=previous if initial else None)
    form = UploadForm(request.POST, request.FILES, dataset=dataset)
    if handler is not None and handler.exceeded:
        form.is_valid()  # cleans the other fields, so that add_error may add to them
        form.add_error("file", file_too_large_message(handler.max_bytes))
        return _render_upload(request, project, membership, form, dataset, status=413)
    if handler is not None and handler.disk_full:
        form.is_valid()
        form.errors.pop("file", None)  # "This field is required.": it was sent, and dropped
        form.add_error("file", handler.disk_full)
        return _render_upload(request, project, membership, form, dataset, status=507)
    if handler is not None and handler.cut_short is not None:
        form.is_valid()
        form.errors.pop("file", None)  # "This field is required.": it was sent, and cut short
        form.add_error("file", upload_cut_short_message(handler.cut_short))
        return _render_upload(request, project, membership, form, dataset, status=400)
    if form.is_valid():
        arguments = {
            "upload": form.cleaned_data["file"],
            "file_format": form.cleaned_data["file_format"] or None,
            "column_mapping": form.column_mapping(),
            "user": request.user,
        }

        def upload() -> str:
            if dataset is None:
                version = services.dataset_create_with_upload(
                    project=project, name=form.cleaned_data["name"], kind=form.cleaned_data["kind"], **arguments
                )
            else:
                version = services.dataset_version_create(dataset=dataset, **arguments)
            messages.success(request, f"Uploaded {isolated(version.original_filename)}; checking it now.")
            return reverse("datasets:version", args=[project.slug, version.dataset.public_id, version.number])

        try:
            return redirect(form_send_once(request, create=upload))
        except ValidationError as error:
            add_service_errors(form, error)
    return _render_upload(request, project, membership, form, dataset, status=400)


def _render_upload(request, project, membership, form, dataset, *, error: str | None = None, status: int = 200,
                   mapping_from=None):
    return render(
        request,
        "datasets/upload.html",
        {
            "project": project,
            "membership": membership,
            "form": form,
            "dataset": dataset,
            "upload_error": error,
            "mapping_from": mapping_from,
            "kind_description": formats.KIND_DESCRIPTIONS[formats.DatasetKind(dataset.kind)] if dataset else None,
            "max_upload_bytes": settings.TEMPER_MAX_UPLOAD_BYTES,
            "too_large_remedy": formats.TOO_LARGE_REMEDY,
        },
        status=status,
    )


@login_required
@require_http_methods(["GET"])
def dataset_detail(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug)
    dataset = selectors.dataset_get(project=project, public_id=public_id)
    return _render_detail(request, project, membership, dataset)


def _render_detail(request, project, membership, dataset, *, about_form: DatasetAboutForm | None = None,
                   status: int = 200) -> HttpResponse:
    versions = list(selectors.version_list(dataset=dataset))
    can_edit = membership.can(Role.MEMBER)
    return render(
        request,
        "datasets/detail.html",
        {
            "project": project,
            "membership": membership,
            "dataset": dataset,
            "source_link": selectors.dataset_source_link(dataset=dataset),
            "about_form": about_form or (DatasetAboutForm(initial=selectors.dataset_about(dataset=dataset))
                                         if can_edit else None),
            "versions": versions,
            "version_rows": selectors.with_previous_ready(versions=versions),
            # numbers count on past deleted versions: never one a run's history names
            "next_number": services.next_version_number(dataset=dataset),
            "can_upload": can_edit,
            "can_delete": selectors.may_delete_dataset(membership=membership, dataset=dataset, versions=versions),
        },
        status=status,
    )


@login_required
@require_POST
def dataset_about(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    """Save "About this dataset" (members, as for an upload); a refusal shows the form again as it was sent,
    naming the field, and changes nothing."""
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    dataset = selectors.dataset_get(project=project, public_id=public_id)
    form = DatasetAboutForm(request.POST)
    if form.is_valid():
        try:
            services.dataset_about_update(dataset=dataset, user=request.user, **form.cleaned_data)
        except ValidationError as error:
            add_service_errors(form, error)
        else:
            messages.success(request, f"Saved what {isolated(dataset.name)} is about.")
            return redirect("datasets:detail", project.slug, dataset.public_id)
    return _render_detail(request, project, membership, dataset, about_form=form, status=400)


@login_required
@require_http_methods(["GET"])
def version_detail(request: HttpRequest, slug: str, public_id: str, number: int) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug)
    dataset = selectors.dataset_get(project=project, public_id=public_id)
    version = selectors.version_get(dataset=dataset, number=number)
    return _render_version(request, project, membership, dataset, version)


def _split_form(dataset: Dataset, version, data=None) -> SplitForm:
    return SplitForm(data, dataset_name=dataset.name, columns=selectors.version_columns(version=version))


def _decontaminate_form(version, data=None, *, initial=None) -> DecontaminateForm | None:
    """The form of "Remove rows shared with another version"; None where the project has no other ready version of
    the kind."""
    choices = [(other.public_id, str(other)) for other in selectors.decontamination_choices(version=version)]
    return DecontaminateForm(data, choices=choices, initial=initial) if choices else None


def _default_worker_alive() -> bool | None:
    """Whether a worker of the ``default`` queue (checks, splits, token counts) is alive; None where workers send no
    heartbeats (``TEMPER_HEARTBEAT_SECONDS=0``), which leave nothing to tell it by."""
    if settings.TEMPER_HEARTBEAT_SECONDS <= 0:
        return None
    return not queue_unserved("default")


def _render_version(request, project, membership, dataset, version, *, split_form: SplitForm | None = None,
                    decontaminate_form: DecontaminateForm | None = None, status: int = 200) -> HttpResponse:
    context = {
        "project": project,
        "membership": membership,
        "dataset": dataset,
        "version": version,
        "can_upload": membership.can(Role.MEMBER),
        "can_delete": selectors.may_delete_version(membership=membership, version=version),
        "review_campaign": export_campaigns(project=project, versions=[version]).get(version.pk),
        "origin": selectors.derivation_origin(version=version),
    }
    if not version.is_settled or version.token_statistics.get("status") == "computing":
        context["default_worker"] = _default_worker_alive()
    if version.status == VersionStatus.FAILED:
        context["problems"] = selectors.problem_groups(version=version)
    if version.status == VersionStatus.READY:
        # A version validated before its turn splits, or its rows read with their prompt once, were counted has them
        # counted by the worker: one pass over its file.
        counting = services.late_count_request(version=version)
        context["turn_splits_counting"] = counting and version.dataset.kind == formats.DatasetKind.SFT
        context["prompt_read_once_counting"] = counting and version.dataset.kind == formats.DatasetKind.PREFERENCE
        base_models = list(basemodel_list(project=project))
        asked = request.GET.get("page", "")
        # A search is cut to the length of a line: it is looked for in every row of the preview.
        search = request.GET.get("q", "").strip()[:SEARCH_MAX_CHARS]
        preview = (selectors.version_search(version=version, text=search, page=whole_number(asked) or 1) if search
                   else selectors.version_preview(version=version, page=whole_number(asked) or 1))
        context.update(
            preview=preview,
            # The page asked for when the preview does not have it (past the end, 0, not ASCII digits):
            # the page says so rather than showing another page as if it were the one asked for.
            page_not_found=asked if asked and whole_number(asked) != preview.page else None,
            charts=selectors.histograms(version.statistics),
            statistics_notes=selectors.statistics_notes(version.statistics),
            token_charts=selectors.histograms(version.token_statistics),
            token_variables=selectors.token_template_variables(version.token_statistics),
            token_split_note=selectors.token_split_note(version.token_statistics),
            token_form=TokenStatisticsForm(base_models=base_models) if base_models else None,
            # The launch page of each task that trains on this kind, this version chosen (runs:new's ?data=).
            launch_tasks=selectors.tasks_training_on(dataset.kind) if membership.can(Role.MEMBER) else [],
            # The New evaluation page with this version chosen, for the kinds an evaluation scores.
            can_evaluate=membership.can(Role.MEMBER) and dataset.kind in METRIC_OF_KIND,
            split_form=split_form or (_split_form(dataset, version) if membership.can(Role.MEMBER) else None),
        )
        if membership.can(Role.MEMBER):
            # A launch warning's link opens the section it advises (``selectors.derivation_url``).
            asked = request.GET.get("derive", "")
            context.update(repeats=selectors.repeats_counted(version=version), derive_asked=asked,
                           decontaminate_form=decontaminate_form or _decontaminate_form(
                               version, initial={"against": request.GET.get("against", "")}))
        if partner := selectors.comparison_partner(version=version):
            context.update(compare_with=partner, compare_pair=sorted((partner.number, version.number)))
    return render(request, "datasets/version.html", context, status=status)


@login_required
@require_POST
def version_split(request: HttpRequest, slug: str, public_id: str, number: int) -> HttpResponse:
    """Split a ready version into a training and a held-out dataset (members, as for an upload): to the training
    side's page, which shows both sides' progress; a refusal shows the version's page again with the form as it was
    sent, each problem beside its field, and saves nothing."""
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    dataset = selectors.dataset_get(project=project, public_id=public_id)
    version = selectors.version_get(dataset=dataset, number=number)
    if version.status != VersionStatus.READY:  # the page offers no form: say why on it
        messages.error(request, f"v{version.number} {version.status_phrase}: only a ready version can be split.")
        return redirect("datasets:version", project.slug, dataset.public_id, version.number)
    form = _split_form(dataset, version, request.POST)
    if form.is_valid():
        def split() -> str:
            train, held = services.dataset_version_split(version=version, user=request.user, **form.cleaned_data)
            messages.success(request, f"Splitting {isolated(str(version))} into {isolated(str(train))} and "
                                      f"{isolated(str(held))}; checking them once written.")
            return reverse("datasets:version", args=[project.slug, train.dataset.public_id, train.number])

        try:
            return redirect(form_send_once(request, create=split))
        except ValidationError as error:
            add_service_errors(form, error)
    return _render_version(request, project, membership, dataset, version, split_form=form, status=400)


# What the new version's page says once a derivation was asked for.
DERIVATION_STARTED = {"dedupe": "Removing the exact repeats of {source} as {made}",
                      "decontaminate": "Removing the rows {source} shares with {against} as {made}"}


@login_required
@require_POST
def version_derive(request: HttpRequest, slug: str, public_id: str, number: int, kind: str) -> HttpResponse:
    """A new version of the dataset written from a ready one without its exact repeats (``kind`` "dedupe") or without
    the rows it shares with another version (``kind`` "decontaminate", the version in ``against``) (members, as for an
    upload; ``services.dataset_version_derive``): to the new version's page, which shows its progress. A refusal saves
    nothing: a decontamination's shows the version's page again with the form as it was sent, the problem beside its
    field; a dedupe's, with nothing typed, is said above the version's page."""
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    dataset = selectors.dataset_get(project=project, public_id=public_id)
    version = selectors.version_get(dataset=dataset, number=number)
    if version.status != VersionStatus.READY:  # the page offers no form: say why on it
        messages.error(request, f"v{version.number} {version.status_phrase}: only a ready version can be "
                                f"{services.DERIVATION_DONE[kind]}.")
        return redirect("datasets:version", project.slug, dataset.public_id, version.number)
    page = reverse("datasets:version", args=[project.slug, dataset.public_id, version.number])
    form = _decontaminate_form(version, request.POST) if kind == "decontaminate" else None

    def derive() -> str:
        against = form.cleaned_data["against"] if form is not None else ""
        made = services.dataset_version_derive(version=version, kind=kind, against=against, user=request.user)
        started = DERIVATION_STARTED[kind].format(source=isolated(str(version)), made=isolated(str(made)),
                                                 against=isolated(made.derivation.get("against_name", "")))
        messages.success(request, f"{started}; checking it once written.")
        return reverse("datasets:version", args=[project.slug, dataset.public_id, made.number])

    if kind == "dedupe":  # nothing typed: a refusal is of the version itself, said on its page
        return redirect(sent_once_or_refused(request, create=derive, back=page))
    if form is None:
        messages.error(request, f"{project.slug} has no other ready {dataset.kind} version to remove the rows of.")
        return redirect(page)
    if form.is_valid():
        try:
            return redirect(form_send_once(request, create=derive))
        except ValidationError as error:
            add_service_errors(form, error)
    return _render_version(request, project, membership, dataset, version, decontaminate_form=form, status=400)


SEARCH_MAX_CHARS = 200


@login_required
@require_http_methods(["GET"])
def version_compare(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    """Version ``?a=`` against version ``?b=`` (by default the latest ready version against the ready one before
    it): the counts of rows unchanged, removed and added, and a page of each of the removed and added rows
    (``?removed_page=``, ``?added_page=``). A comparison that cannot be made says why on the page: 404 for a version
    number the dataset has not got, as its version page answers, 200 for the rest (a bad number, a version not
    ready)."""
    project, membership = get_project_for_user(request.user, slug)
    dataset = selectors.dataset_get(project=project, public_id=public_id)
    context = {"project": project, "membership": membership, "dataset": dataset,
               "ready_versions": selectors.ready_versions(dataset=dataset)}
    status = 200
    try:
        older, newer = selectors.comparison_versions(dataset=dataset, a=request.GET.get("a"), b=request.GET.get("b"))
        differences = selectors.version_differences(a=older, b=newer)
    except Http404 as error:
        context["refusal"], status = str(error), 404
    except ValidationError as error:
        context["refusal"] = " ".join(error.messages)
    else:
        context.update(
            a=older, b=newer, differences=differences,
            removed=selectors.difference_page(version=older, rows=differences.removed,
                                              page=whole_number(request.GET.get("removed_page")) or 1),
            added=selectors.difference_page(version=newer, rows=differences.added,
                                            page=whole_number(request.GET.get("added_page")) or 1),
        )
    return render(request, "datasets/compare.html", context, status=status)


@login_required
@require_http_methods(["GET"])
def version_download(request: HttpRequest, slug: str, public_id: str, number: int) -> StreamingHttpResponse:
    project, _membership = get_project_for_user(request.user, slug)
    dataset = selectors.dataset_get(project=project, public_id=public_id)
    version = selectors.version_get(dataset=dataset, number=number)
    if version.status != VersionStatus.READY or not version.absolute_path.is_file():
        raise Http404("only ready versions can be downloaded")
    # Streamed (webapp.core.streaming): a FileResponse is read whole into the web process under ASGI.
    return file_download(version.absolute_path, filename=version.original_filename, label=download_label(request),
                         access_lost=session_access_lost(
        request, lambda account: selectors.version_get(
            dataset=selectors.dataset_get(project=get_project_for_user(account, slug)[0], public_id=public_id),
            number=number)))


@login_required
@require_POST
def version_requeue(request: HttpRequest, slug: str, public_id: str, number: int) -> HttpResponse:
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    dataset = selectors.dataset_get(project=project, public_id=public_id)
    version = selectors.version_get(dataset=dataset, number=number)
    page = reverse("datasets:version", args=[project.slug, dataset.public_id, version.number])

    def requeue() -> str:
        services.dataset_version_requeue(version=version)
        messages.success(request, f"Queued the check of v{version.number} again.")
        return page

    return redirect(sent_once_or_refused(request, create=requeue, back=page))


@login_required
@require_POST
def version_delete(request: HttpRequest, slug: str, public_id: str, number: int) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    dataset_page = reverse("datasets:detail", args=[project.slug, public_id])

    def delete() -> str:  # looked up here: a second click finds the version gone and lands where the first did
        dataset = selectors.dataset_get(project=project, public_id=public_id)
        version = selectors.version_get(dataset=dataset, number=number)
        selectors.ensure_may_delete_version(membership=membership, version=version)
        services.dataset_version_delete(version=version, actor=request.user)
        messages.success(request, f"Deleted {isolated(str(version))} and its file.")
        return dataset_page

    return redirect(deleted_once_or_refused(request, delete=delete, gone=dataset_page, back=reverse(
        "datasets:version", args=[project.slug, public_id, number])))


@login_required
@require_POST
def dataset_delete(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    listed = reverse("datasets:list", args=[project.slug])

    def delete() -> str:
        dataset = selectors.dataset_get(project=project, public_id=public_id)
        versions = list(selectors.version_list(dataset=dataset))
        selectors.ensure_may_delete_dataset(membership=membership, dataset=dataset, versions=versions)
        services.dataset_delete(dataset=dataset, actor=request.user)
        messages.success(request, f"Deleted the dataset {isolated(dataset.name)} with its {len(versions)} "
                                  f"version{'s' if len(versions) != 1 else ''} and their files.")
        return listed

    return redirect(deleted_once_or_refused(request, delete=delete, gone=listed, back=reverse(
        "datasets:detail", args=[project.slug, public_id])))


@login_required
@require_POST
def version_token_statistics(request: HttpRequest, slug: str, public_id: str, number: int) -> HttpResponse:
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    dataset = selectors.dataset_get(project=project, public_id=public_id)
    version = selectors.version_get(dataset=dataset, number=number)
    base_models = list(basemodel_list(project=project))
    form = TokenStatisticsForm(request.POST, base_models=base_models)
    if form.is_valid():
        base_model = next(model for model in base_models if model.public_id == form.cleaned_data["base_model"])
        page = reverse("datasets:version", args=[project.slug, dataset.public_id, version.number])

        def count() -> str:
            services.token_statistics_request(version=version, base_model=base_model)
            messages.success(request, f"Counting tokens with the {isolated(base_model.name)} tokenizer.")
            return page

        return redirect(sent_once_or_refused(request, create=count, back=page))
    messages.error(request, "choose a base model of this project")
    return redirect("datasets:version", project.slug, dataset.public_id, version.number)
