"""The REST API (``/api/v1/``): JSON over HTTP with bearer tokens (``Authorization: Bearer tmp_…``,
created on the API tokens page). The same access rules as the pages: an outsider's request for
anything of a project gets 404, a viewer's write gets 403. Errors are JSON: ``{"errors": {field:
[messages]}}`` for bad input, ``{"detail": ...}`` otherwise. The OpenAPI document is
``/api/v1/openapi.json`` (``webapp.api.openapi``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pydantic
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt

from jaxengine.words import with_article
from webapp.activity import selectors as activity_selectors
from webapp.api import paging, schemas
from webapp.api.problems import problems_by_field, query_problems, value_as_sent
from webapp.api.services import token_authenticate, token_expired_at
from webapp.basemodels import selectors as basemodel_selectors
from webapp.basemodels import services as basemodel_services
from webapp.basemodels import uploads as basemodel_uploads
from webapp.chat.access import chat_access
from webapp.chat.models import ProjectToken
from webapp.chat.tokens import TOKEN_PREFIX as PROJECT_TOKEN_PREFIX
from webapp.chat.tokens import project_token_create, project_token_list, project_token_revoke
from webapp.core.auth_header import bearer_secret, token_expired, token_expiry
from webapp.core.bidi import isolated
from webapp.core import json_bodies
from webapp.core.forms import errors_by_key
from webapp.core.numbers import MAX_STORED_INT, TOO_MANY_DIGITS, whole_number
from webapp.core.sse import AccessLost, access_lost_when
from webapp.core.streaming import download_label, file_download
from webapp.core.templatetags.temper import when
from webapp.core.submissions import (IDEMPOTENCY_HEADER, IdempotencyKeyReused, Sent, SendingInProgress,
                                     request_send_once, request_send_once_secret)
from webapp.datasets import selectors as dataset_selectors
from webapp.datasets import services as dataset_services
from webapp.datasets.models import Dataset, DatasetVersion, VersionStatus
from webapp.evals import selectors as evaluation_selectors
from webapp.evals import services as evaluation_services
from webapp.core.disk_free import upload_room_refusal
from webapp.datasets.uploads import (LimitedUploadHandler, body_too_large, file_too_large_message,
                                     name_as_uploaded, one_file_per_upload_message, upload_cut_short_message)
from webapp.projects.access import get_project_for_user
from webapp.projects.models import Project, Role
from webapp.projects import services as project_services
from webapp.projects.selectors import project_list_for_user
from webapp.projects.storage import GONE, ProjectStorage, project_storage
from webapp.review import selectors as review_selectors
from webapp.review.models import Campaign
from webapp.runs import artifacts, reporting
from webapp.runs import selectors as run_selectors
from webapp.runs import services as run_services
from webapp.runs import serving_copies, sweeps
from webapp.runs.access import get_run_for_user
from webapp.runs.models import Artifact, ArtifactKind, ProjectCheckpointPrune, Run
from webapp.webhooks import selectors as webhook_selectors
from webapp.webhooks import services as webhook_services
from webapp.webhooks.models import Webhook, WebhookDelivery


def _error(status: int, **body: Any) -> JsonResponse:
    return JsonResponse(body, status=status)


def _method_not_allowed(request: HttpRequest, methods: tuple[str, ...]) -> JsonResponse:
    """405 naming the methods the address takes, in the body and in ``Allow`` (RFC 9110 requires the header
    on a 405: clients and proxies read it to know what to send instead)."""
    response = _error(405, detail=f"{request.method} is not allowed here; use {', '.join(methods)}")
    response["Allow"] = ", ".join(methods)
    return response


def _created(body: dict[str, Any], sent: Sent, *, status: int = 201) -> JsonResponse:
    """201 with what a POST made (``status`` 202: what it queued); a repeat of a request with an ``Idempotency-Key``
    (see ``webapp.core.submissions``) gets what the first made, marked ``Idempotent-Replayed: true``."""
    response = JsonResponse(body, status=status)
    if not sent.created:
        response["Idempotent-Replayed"] = "true"
    return response


def _why_unauthenticated(header: str) -> str:
    """Why ``Authorization: header`` authenticates no one, in words: a token sent is not told to send one."""
    secret = bearer_secret(header)
    if secret is None:
        return "send 'Authorization: Bearer <token>' with a token from the API tokens page"
    if secret.startswith(PROJECT_TOKEN_PREFIX):
        return ("this is a project token (tpk_…), for the OpenAI-compatible API at /v1/; the REST API takes a token "
                "from the API tokens page (tmp_…)")
    if (expired_at := token_expired_at(header)) is not None:
        return (f"the token sent expired at {when(expired_at)}; make a new one on the API tokens page and send it as "
                "'Authorization: Bearer <token>'")
    return ("the token sent is not a valid API token (revoked, mistyped, or its user deactivated); make one on the API "
            "tokens page and send it as 'Authorization: Bearer <token>'")


def _token_access_lost(request: HttpRequest, lookup: Callable[[AbstractBaseUser], object]) -> AccessLost:
    """A download's ``access_lost`` (``webapp.core.streaming``): its token read again (revoked, expired, its user
    deactivated), then ``lookup``, the view's access check, with the account as it is now."""
    header = request.headers.get("Authorization", "")
    return access_lost_when(lambda: token_authenticate(header), lookup)


def api_view(methods: tuple[str, ...], *, query: tuple[str, ...] = (), delete_query: tuple[str, ...] = ()) -> Callable:
    """Token authentication, allowed methods and query parameters (``query``: those a GET reads; ``delete_query``:
    those a DELETE reads, a flag such as ``delete_files``; the other methods read none), and JSON errors around an
    API view."""

    allowed = (*methods, "HEAD") if "GET" in methods and "HEAD" not in methods else methods
    read_query = {"get": query, "delete": delete_query}  # by method, as the OpenAPI document keys operations

    def decorate(view: Callable) -> Callable:
        @csrf_exempt  # bearer tokens, not cookies: there is no cross-site request to forge
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            header = request.headers.get("Authorization", "")
            user = token_authenticate(header)
            if user is None:
                response = _error(401, detail=_why_unauthenticated(header))
                response["WWW-Authenticate"] = 'Bearer realm="temper"'
                return response
            if request.method not in allowed:
                return _method_not_allowed(request, allowed)
            if request.method == "HEAD":
                # HEAD is GET without the content (RFC 9110, 9.3.2): the views branch on GET, and the server
                # leaves the body out of a HEAD response (uvicorn does).
                request.method = "GET"
            request.user = user
            if problems := query_problems(dict(request.GET.lists()),
                                          allowed=read_query.get(request.method.lower(), ())):
                return _error(400, errors=problems)
            try:
                return view(request, *args, **kwargs)
            except Http404 as error:
                return _error(404, detail=str(error) or "not found")
            except IdempotencyKeyReused as error:
                return _error(422, errors={IDEMPOTENCY_HEADER: [str(error)]})
            except SendingInProgress as error:  # a ValidationError too: before that
                return _error(409, detail=error.message)
            except PermissionDenied as error:
                return _error(403, detail=str(error))
            except ValidationError as error:
                errors = errors_by_key(error)
                return _error(400, errors=errors)
            except BodyInvalid as error:
                return _error(400, errors=problems_by_field(error.error, schema=error.schema))
            except pydantic.ValidationError as error:  # not a body's: no schema to name the allowed keys from
                return _error(400, errors=problems_by_field(error, schema=None))

        wrapper.query_parameters = read_query  # the OpenAPI document's query parameters are checked against it
        return wrapper

    return decorate


def _multipart_checked(request: HttpRequest, *, text_fields: tuple[str, ...], file_field: str,
                       several_files: Callable[[int], str], fields_sent: str) -> None:
    """Refuse what Django's multipart parser would drop without a word: a field sent twice (it keeps the last;
    ``several_files`` words the files sent as ``file_field``), and a field not among ``text_fields`` and
    ``file_field`` (as a JSON body's unknown key is: "format" for file_format was dropped), each named with
    ``fields_sent`` ("a model upload; send name and archive")."""
    for field, sent in request.FILES.lists():
        if len(sent) > 1:
            raise ValidationError({field: several_files(len(sent))})
    for field, sent in request.POST.lists():
        if len(sent) > 1:
            raise ValidationError({field: f"{len(sent)} parts named {field!r}: send one"})
    unknown = [field for field in request.POST if field not in text_fields]
    unknown += [field for field in request.FILES if field != file_field]
    if unknown:
        raise ValidationError({field: f"{field!r} is not a field of {fields_sent}" for field in unknown})


@contextlib.contextmanager
def _fields_as_sent(names: dict[str, str]) -> Iterator[None]:
    """Key a service's ``ValidationError`` by the request's field names: ``names`` maps a service
    argument (``column_mapping``) to the field a client sends it as (``mapping``), so that the client
    can match each error to what it sent."""
    try:
        yield
    except ValidationError as error:
        if not hasattr(error, "error_dict"):
            raise
        renamed: dict[str, list[str]] = {}
        for field, messages in error.message_dict.items():
            head, dot, rest = field.partition(".")  # column_mapping.prompt: mapping.prompt
            renamed.setdefault(names.get(field, names.get(head, head) + dot + rest), []).extend(messages)
        raise ValidationError(renamed) from error


class BodyInvalid(Exception):
    """A body that ``schema`` refused: said in words by ``webapp.api.problems``, which walks the schema."""

    def __init__(self, error: pydantic.ValidationError, schema: type[pydantic.BaseModel]):
        super().__init__(str(error))
        self.error, self.schema = error, schema


def _body(request: HttpRequest, schema: type[pydantic.BaseModel]) -> Any:
    try:
        return schema.model_validate(_json_body(request))
    except pydantic.ValidationError as error:
        raise BodyInvalid(error, schema) from None


FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


def _json_body(request: HttpRequest) -> Any:
    try:
        return json_bodies.loads(request.body or b"{}")
    except json.JSONDecodeError as error:
        # curl -F or --data-urlencode sends a form: JSON's words alone did not say what to send instead.
        remedy = (f"; it was sent as a form ({request.content_type}): send a JSON object with 'Content-Type: "
                  "application/json' (only POST datasets/ takes a form, for its file)"
                  if request.content_type in FORM_TYPES else "; send a JSON object")
        where = f"{error.msg} at line {error.lineno}"
        raise ValidationError({"__all__": f"the body is not JSON: {where}{remedy}"}) from None
    except json_bodies.DuplicateKey as error:
        raise ValidationError({"__all__": str(error)}) from None
    except UnicodeDecodeError as error:  # a ValueError too: it was taken for the digit limit below
        raise ValidationError({"__all__": f"the body is not JSON in UTF-8: byte 0x{error.object[error.start]:02x} at "
                                          f"position {error.start} is not UTF-8; send JSON encoded as UTF-8"}) from None
    except RecursionError:  # "[" * 100000: json's decoder recurses once per level
        raise ValidationError({"__all__": "the body nests too deeply to be a request"}) from None
    except ValueError:  # not a JSONDecodeError: a number past Python's digit limit
        raise ValidationError({"__all__": f"the body cannot be read: {TOO_MANY_DIGITS}"}) from None


def _version_json(version: DatasetVersion, *, review_campaign: Campaign | None = None) -> dict[str, Any]:
    """A dataset version; ``review_campaign``: the campaign it was exported from, if it was."""
    return {"id": version.public_id, "dataset": version.dataset.public_id, "number": version.number,
            "status": version.status,
            "filename": version.original_filename, "format": version.format, "size_bytes": version.size_bytes,
            "row_count": version.row_count, "error_count": version.error_count, "errors": version.errors,
            "notice": version.notice, "mapping": version.column_mapping,
            "statistics": dataset_selectors.shown_statistics(version.statistics),
            "created_at": version.created_at.isoformat(),
            "review_campaign": ({"id": review_campaign.public_id, "name": review_campaign.name}
                                if review_campaign is not None else None),
            "derivation": version.derivation or None}


def _dataset_json(dataset: Dataset, *, versions: bool = False) -> dict[str, Any]:
    body = {"id": dataset.public_id, "name": dataset.name, "kind": dataset.kind,
            **dataset_selectors.dataset_about(dataset=dataset), "created_at": dataset.created_at.isoformat()}
    if versions:
        listed = list(dataset_selectors.version_list(dataset=dataset))
        campaigns = review_selectors.export_campaigns(project=dataset.project, versions=listed)
        body["versions"] = [_version_json(version, review_campaign=campaigns.get(version.pk)) for version in listed]
    return body


def _run_json(run: Run) -> dict[str, Any]:
    return {"id": run.public_id, "name": run.name, "task": run.task, "status": run.status,
            "error_message": run.error_message, "notice": run.notice, "stopping": run.is_stopping, "attempt": run.attempt,
            "current_step": run.current_step, "total_steps": run.total_steps, "tokens_seen": run.tokens_seen,
            "tags": run.tags, "archived": run.archived, "created_at": run.created_at.isoformat(),
            "finished_at": run.finished_at.isoformat() if run.finished_at else None,
            "final_metrics": run.final_metrics}


def _run_detail_json(request: HttpRequest, run: Run) -> dict[str, Any]:
    """A run with its spec, summary, notes and artifacts, each with the address that downloads it."""
    return {**_run_json(run), "spec": run.spec, "summary": run.summary, "notes": run.notes,
            "artifacts": [{"kind": artifact.kind, "step": artifact.step, "size_bytes": artifact.size_bytes,
                           "folder_gone": basemodel_selectors.model_dir_gone(artifact.path),
                           "url": _artifact_url(request, run, artifact),
                           "card_url": _card_url(request, run, artifact)}
                          for artifact in run.artifacts.all()]}


def _artifact_url(request: HttpRequest, run: Run, artifact: Artifact, *, name: str = "api:run_artifact") -> str:
    """The address of ``artifact``'s download (``name``: or of another address of it, its card's)."""
    # A checkpoint is named by its step; the model and the adapter, one a run, need none (run_artifact).
    path = reverse(name, kwargs={"slug": run.project.slug, "run_id": run.public_id, "kind": artifact.kind})
    return request.build_absolute_uri(path + (f"?step={artifact.step}" if artifact.kind == ArtifactKind.CHECKPOINT
                                              else ""))


def _card_url(request: HttpRequest, run: Run, artifact: Artifact) -> str | None:
    """The address of ``artifact``'s model card; None for an export written before exports had one."""
    return _artifact_url(request, run, artifact, name="api:run_artifact_card") if artifact.has_model_card else None


def _base_model_json(model, *, listing: bool = False) -> dict[str, Any]:
    # folder_gone: as the launch form lists it (``runs.selectors.model_choices``), the launch refusing it; ``listing``
    # every model of the project, the answer model_dir_gone keeps for listings. The list, the detail and an upload's
    # answer are this one dict, licence included (schemas.BaseModelOut).
    return {"id": model.public_id, "name": model.name, "architecture": model.architecture,
            "model_type": model.model_type, "parameter_count": model.parameter_count,
            "context_length": model.context_length, "vocab_size": model.vocab_size,
            "tokenizer_type": model.tokenizer_type, "dtype": model.dtype, "size_bytes": model.size_bytes,
            "uploaded": model.uploaded, "created_at": model.created_at.isoformat(),
            "folder_gone": basemodel_selectors.model_dir_gone(model.path, listing=listing),
            "licence": _licence_json(model)}


# What a project's listing links to: the lists a script starts from (``api:<name>``), keyed as its answer names them.
PROJECT_LISTS = {"base_models": "api:base_models", "datasets": "api:datasets", "runs": "api:runs",
                 "pipelines": "api:pipelines", "evaluations": "api:evaluations", "activity": "api:activity"}


# Listed for owners only: the other roles get 403 there (a hook's address and secret are secrets).
OWNER_LISTS = {"webhooks": "api:webhooks"}


def _project_json(request: HttpRequest, project: Project) -> dict[str, Any]:
    """A project as the token's user sees it: ``project.role`` (``project_list_for_user``'s) is theirs."""
    lists = PROJECT_LISTS | (OWNER_LISTS if project.role == Role.OWNER else {})
    return {"slug": project.slug, "name": project.name, "description": project.description, "role": project.role,
            "created_at": project.created_at.isoformat(),
            "urls": {key: request.build_absolute_uri(reverse(name, kwargs={"slug": project.slug}))
                     for key, name in lists.items()}}


@api_view(("GET",))
def projects(request: HttpRequest) -> JsonResponse:
    """The projects the token's user belongs to, by name, with their role in each: where a script learns the slugs
    every other address names (it saw them only in a browser's address bar)."""
    return JsonResponse({"projects": [_project_json(request, project)
                                      for project in project_list_for_user(user=request.user)]})


@api_view(("GET", "PATCH"))
def project_detail(request: HttpRequest, slug: str) -> JsonResponse:
    """GET: the project as ``GET /api/v1/projects/`` lists it. PATCH ``{"name", "description"}`` (either; owners
    only): what its Settings page changes, by the same service and rules, all or nothing; the slug never changes."""
    minimum = Role.OWNER if request.method == "PATCH" else Role.VIEWER
    project, membership = get_project_for_user(request.user, slug, min_role=minimum)
    if request.method == "PATCH":
        body = _body(request, schemas.ProjectUpdate)
        fields = {"name": project.name, "description": project.description}
        project = project_services.project_update(project=project, user=request.user,
                                                  **fields | body.model_dump(include=body.model_fields_set))
    project.role = membership.role  # as project_list_for_user annotates it
    return JsonResponse(_project_json(request, project))


@api_view(("GET",))
def storage(request: HttpRequest, slug: str) -> JsonResponse:
    """What the project's runs, datasets and base models take on disk now, in bytes: the Storage page's figures."""
    project, _membership = get_project_for_user(request.user, slug)
    return JsonResponse(_storage_json(project_storage(project=project)))


def _storage_json(storage: ProjectStorage) -> dict[str, Any]:
    return {
        "total_bytes": storage.total_bytes, "measured_at": storage.measured_at.isoformat(),
        "free_bytes": storage.filesystems[0].free_bytes, "filesystem_bytes": storage.filesystems[0].filesystem_bytes,
        "filesystems": [{"setting": disk.setting, "free_bytes": disk.free_bytes,
                         "filesystem_bytes": disk.filesystem_bytes, "low": disk.low} for disk in storage.filesystems],
        "by_kind": {"checkpoint_bytes": storage.checkpoint_bytes, "export_bytes": storage.export_bytes,
                    "run_other_bytes": storage.run_other_bytes, "run_bytes": storage.run_bytes,
                    "dataset_bytes": storage.dataset_bytes, "base_model_bytes": storage.base_model_bytes,
                    "outside_bytes": storage.outside_bytes},
        "runs": [{"id": row.run.public_id, "name": row.run.name, "status": row.run.status,
                  "archived": row.run.archived, "checkpoints": row.checkpoints,
                  "checkpoint_bytes": row.checkpoint_bytes, "export_bytes": row.export_bytes,
                  "other_bytes": row.other_bytes, "total_bytes": row.total_bytes, "folder_gone": row.folder == GONE,
                  "prunable_bytes": row.prunable_bytes}
                 for row in storage.runs],
        "datasets": [{"id": row.dataset.public_id, "name": row.dataset.name, "versions": row.versions,
                      "bytes": row.bytes, "folder_gone": row.folder == GONE} for row in storage.datasets],
        "base_models": [{"id": row.base_model.public_id, "name": row.base_model.name, "path": row.base_model.path,
                         "uploaded": row.base_model.uploaded, "bytes": row.bytes,
                         "serving_copy_bytes": row.serving_copy_bytes, "outside_data_directory": row.outside,
                         "folder_gone": row.folder == GONE} for row in storage.base_models],
    }


def _prune_state(prune: ProjectCheckpointPrune) -> str:
    """Where ``prune`` stands, as the Storage page words it (``projects/_storage_prune.html``)."""
    if run_services.project_prune_is_running(prune):
        return "queued" if prune.runs_total is None else "running"
    if prune.finished_at is not None:
        return "finished"
    return "never_started" if prune.runs_total is None else "stopped"


def _prune_json(prune: ProjectCheckpointPrune | None) -> dict[str, Any]:
    if prune is None:
        return {"prune": None}
    return {"prune": {
        "state": _prune_state(prune), "requested_at": prune.requested_at.isoformat(),
        "requested_by": prune.requested_by.get_username() if prune.requested_by else None,
        "runs_done": prune.runs_done, "runs_total": prune.runs_total, "checkpoints_deleted": prune.checkpoints_deleted,
        "bytes_freed": prune.bytes_freed, "failures": prune.failures,
        "finished_at": prune.finished_at.isoformat() if prune.finished_at else None}}


@api_view(("GET", "POST"))
def storage_prune(request: HttpRequest, slug: str) -> JsonResponse:
    """GET: the project's newest project-wide checkpoint prune, under way or its outcome (every member, as the
    Storage page shows it). POST (owners): queue one, as the Storage page's *Prune checkpoints of ended runs…*
    (``run_services.project_checkpoints_prune_request``): every ended run keeps its newest and its best checkpoint;
    202 with its state; 409 while another is queued or running."""
    if request.method == "GET":
        project, _membership = get_project_for_user(request.user, slug)
        return JsonResponse(_prune_json(run_services.project_prune_latest(project=project)))
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    _body(request, schemas.StoragePruneRequest)  # no field: one sent is refused, not ignored

    def prune() -> str:
        try:
            return str(run_services.project_checkpoints_prune_request(project=project, user=request.user).pk)
        except ValidationError as error:  # the page's words, and where an API caller follows the prune
            raise ValidationError(f"{' '.join(error.messages)} GET {request.path} follows it.") from None

    sent = _sent_once_or_refused(request, create=prune, missing=lambda _refusal: "")
    if isinstance(sent, JsonResponse):
        return sent
    return _created(_prune_json(ProjectCheckpointPrune.objects.select_related("requested_by").get(
        pk=int(sent.result))), sent, status=202)


@api_view(("GET", "POST"))
def base_models(request: HttpRequest, slug: str) -> JsonResponse:
    """GET: the project's registered base models, by name: the ``bm_…`` ids a run's ``model`` names. POST (an
    owner; multipart: ``name``, ``archive``): upload a model archive, unpacked into the project's own folder and
    registered as the Upload page does (``uploads.basemodel_upload_once``); 201 with the model."""
    if request.method == "POST":
        return _base_model_upload(request, slug)
    project, _membership = get_project_for_user(request.user, slug)
    return JsonResponse({"base_models": [_base_model_json(model, listing=True)
                                         for model in basemodel_selectors.basemodel_list(project=project)]})


def _base_model_upload(request: HttpRequest, slug: str) -> JsonResponse:
    # The role and the body's length are checked, and the bounded handler installed, before the body is parsed: the
    # archive streams to a temporary file as the Upload page's does, and a non-owner's is never read.
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    limit = settings.TEMPER_MODEL_UPLOAD_MAX_BYTES
    if body_too_large(request.META.get("CONTENT_LENGTH"), max_upload_bytes=limit):
        return _error(413, detail=basemodel_uploads.archive_too_large_message(limit))
    if refusal := upload_room_refusal(request.META.get("CONTENT_LENGTH"), destination=settings.MODELS_ROOT,
                                      unpacked=True):
        return _error(507, detail=refusal)
    handler = LimitedUploadHandler(request, max_bytes=limit)
    request.upload_handlers = [handler]
    files = request.FILES  # parsed here: the archive streams to a temporary file, dropped once past the limit
    if handler.exceeded:
        return _error(413, detail=basemodel_uploads.archive_too_large_message(limit))
    if handler.disk_full:
        return _error(507, detail=handler.disk_full)
    if handler.cut_short is not None:
        raise ValidationError({"archive": upload_cut_short_message(handler.cut_short)})
    _multipart_checked(request, text_fields=("name",), file_field="archive",
                       several_files=basemodel_uploads.several_archives_message,
                       fields_sent="a model upload; send name and archive")
    missing = {}
    if "archive" not in files:
        missing["archive"] = ("attach the model archive (a .zip, .tar or .tar.gz of its directory) as the multipart "
                              "field 'archive', e.g. curl -F archive=@my-model.tar.gz")
    if not request.POST.get("name", "").strip():
        missing["name"] = ("send the model's name as the multipart field 'name' (also its folder's name: letters, "
                           "digits, '.', '_' and '-')")
    if missing:
        raise ValidationError(missing)
    # A retry is answered before the minutes of unpacking; the archive is told by its name, size and ends.
    archive = files["archive"]
    sent = basemodel_uploads.basemodel_upload_once(
        project=project, name=request.POST["name"], archive=Path(archive.temporary_file_path()),
        archive_name=name_as_uploaded(archive.name), user=request.user, made=lambda base_model: base_model.public_id,
        send_once=lambda create, prepare: request_send_once(request, create=create, prepare=prepare,
                                                            sample_files=True))
    return _created(_base_model_json(basemodel_selectors.basemodel_get(project=project, public_id=sent.result)), sent)


@api_view(("GET", "DELETE"), delete_query=("delete_files",))
def base_model_detail(request: HttpRequest, slug: str, model_id: str) -> HttpResponse:
    """GET: a base model. DELETE: unregister it (an owner, or the member who registered it; its serving copies
    go, its directory stays; a 400 naming the work that still needs it). ``?delete_files=true`` (an owner, a model
    Temper unpacked itself: ``uploaded``) deletes its folder too once unregistered, freeing the name for a new
    upload; a 400 on ``delete_files`` says why a folder may not go, and nothing is deleted."""
    project, membership = get_project_for_user(request.user, slug,
                                               min_role=Role.VIEWER if request.method == "GET" else Role.MEMBER)
    base_model = basemodel_selectors.basemodel_get(project=project, public_id=model_id)
    if request.method == "GET":
        return JsonResponse(_base_model_json(base_model))
    delete_files = _query_flag(request, "delete_files")
    basemodel_selectors.ensure_may_unregister_base_model(membership=membership, base_model=base_model)
    if delete_files:
        basemodel_selectors.ensure_may_delete_base_model_files(membership=membership)
    removal = basemodel_services.basemodel_unregister(base_model=base_model, delete_files=delete_files,
                                                         actor=request.user)
    if removal is not None and not removal.removed:  # committed: the registration is gone, the files are not
        return _error(500, detail=f"unregistered the base model, but its folder {removal.path} could not be deleted "
                                  f"({removal.error}); ask an administrator to remove it")
    return HttpResponse(status=204)


def _licence_json(base_model) -> dict[str, Any] | None:
    """The licence facts the base model's page shows (``base_model_licence``); None for a folder the project may not
    read, whose README.md and files may be another project's."""
    if basemodel_selectors.base_model_refusal(base_model=base_model):
        return None
    licence = basemodel_selectors.base_model_licence(base_model=base_model)
    return {"license": licence.get("license"), "license_name": licence.get("license_name"),
            "license_link": licence.get("license_link"), "files": licence["files"],
            "not_copied": licence["not_copied"], "stated": licence["stated"],
            "built_with_llama": licence["built_with_llama"]}


def _query_flag(request: HttpRequest, name: str) -> bool:
    """The query parameter ``name`` as true (``true``, ``1``) or false (``false``, ``0``, left out); a 400 naming it
    otherwise."""
    value = request.GET.get(name, "false").strip().lower()
    if value not in ("true", "1", "false", "0"):
        raise ValidationError({name: f"{value_as_sent(request.GET[name])} is not true or false; send {name}=true or "
                                     "leave it out"})
    return value in ("true", "1")


# The text fields of a dataset upload (besides its ``file``).
UPLOAD_TEXT_FIELDS = ("kind", "name", "dataset", "file_format", "mapping")


@api_view(("GET", "POST"), query=paging.QUERY)
def datasets(request: HttpRequest, slug: str) -> JsonResponse:
    """GET: the project's datasets by name, a page at a time (``limit``, and the ``next`` link). POST
    (multipart: ``file``, ``kind``, and ``name`` for a new dataset or ``dataset`` (an id) for a new version;
    optional ``file_format``, ``mapping`` JSON): upload; the version is checked by a worker (poll its dataset
    until ``ready`` or ``failed``)."""
    if request.method == "GET":
        project, _membership = get_project_for_user(request.user, slug)
        asked = paging.page_query(request, sort="datasets")
        page = dataset_selectors.dataset_page(project=project, after=asked.after, limit=asked.limit)
        return JsonResponse({"datasets": [_dataset_json(dataset) for dataset in page.rows],
                             "next": paging.next_link(request, sort="datasets", after=page.next_after)})
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    if refusal := upload_room_refusal(request.META.get("CONTENT_LENGTH"), destination=settings.DATA_ROOT):
        return _error(507, detail=refusal)
    # Bounded as the Upload page's (the guard in front has held the body to the limit): a file cut short is named.
    handler = LimitedUploadHandler(request, max_bytes=settings.TEMPER_MAX_UPLOAD_BYTES)
    request.upload_handlers = [handler]
    files = request.FILES  # parsed here, with the handler
    if handler.exceeded:
        return _error(413, detail=file_too_large_message(handler.max_bytes))
    if handler.disk_full:
        return _error(507, detail=handler.disk_full)
    if handler.cut_short is not None:
        raise ValidationError({"file": upload_cut_short_message(handler.cut_short)})
    _multipart_checked(request, text_fields=UPLOAD_TEXT_FIELDS, file_field="file",
                       several_files=one_file_per_upload_message,
                       fields_sent="an upload; send file, kind, name (or dataset for a new version), file_format, "
                                   "mapping")
    upload = files.get("file")
    if upload is None:
        raise ValidationError({"file": "attach the dataset file as the multipart field 'file'"})
    try:
        mapping = json_bodies.loads(request.POST.get("mapping") or "{}")
    except json.JSONDecodeError as error:
        raise ValidationError({"mapping": f"mapping is not JSON ({error.msg} at column {error.colno}): send a JSON "
                                          'object of field → column, e.g. {"prompt": "question"}'}) from None
    except json_bodies.DuplicateKey as error:
        raise ValidationError({"mapping": f"mapping: {error}"}) from None
    except (ValueError, RecursionError):  # a number past Python's digit limit, nesting too deep
        raise ValidationError({"mapping": "mapping must be a JSON object of field → column"}) from None
    arguments = {"upload": upload, "file_format": request.POST.get("file_format") or None,
                 "column_mapping": mapping, "user": request.user}

    def upload_version() -> str:
        if request.POST.get("dataset"):
            try:
                dataset = dataset_selectors.dataset_get(project=project, public_id=request.POST["dataset"])
            except Http404:  # a field of the body, not the address: a 404 named neither it nor what to send
                raise ValidationError({"dataset": f"'{isolated(request.POST['dataset'])}' is not a dataset of "
                                                  f"{project.slug}; send the id (ds_…) that GET datasets/ lists, or "
                                                  "leave dataset out and send name and kind for a new dataset"}) from None
            kind = request.POST.get("kind")
            if kind and kind.strip().lower() != dataset.kind:  # in any letter case, as a new dataset's  # it was ignored: the file was then checked as the dataset's kind
                raise ValidationError({"kind": f"dataset {isolated(dataset.name)} is {with_article(dataset.kind)} dataset, "
                                               f"not {isolated(kind)}; "
                                               "a new version keeps its dataset's kind (leave kind out)"})
            name = request.POST.get("name")
            if name and dataset_selectors.dataset_named(project=project, name=name) != dataset:  # it was ignored too
                raise ValidationError({"name": f"dataset {dataset.public_id} is named {isolated(dataset.name)}, "
                                               f"not {isolated(name)}: send name for a new dataset, or dataset (its id) for a new "
                                               "version of one, not both"})
            # As the web form does, a new version sent without a mapping is read with the last version's: it
            # usually has the same columns. One sent, even {}, is its own.
            previous = dataset_selectors.version_list(dataset=dataset).first() if "mapping" not in request.POST else None
            if previous is not None and previous.column_mapping:
                arguments["column_mapping"] = previous.column_mapping
            else:
                previous = None
            version = dataset_services.dataset_version_create(dataset=dataset, **arguments)
        else:
            previous = None
            version = dataset_services.dataset_create_with_upload(
                project=project, name=request.POST.get("name", ""), kind=request.POST.get("kind", ""), **arguments)
        return f"{version.dataset.public_id} {version.number} {previous.number if previous is not None else '-'}"

    with _fields_as_sent({"column_mapping": "mapping"}):
        sent = request_send_once(request, create=upload_version)
    dataset_id, number, *inherited = sent.result.split()  # a replay of one answered before: no third word
    version = dataset_selectors.version_get(dataset=dataset_selectors.dataset_get(project=project, public_id=dataset_id),
                                            number=int(number))
    return _created({"dataset": _dataset_json(version.dataset), "version": _version_json(version),
                     "mapping_inherited_from": int(inherited[0]) if inherited and inherited[0] != "-" else None}, sent)


@api_view(("GET", "PATCH", "DELETE"))
def dataset_detail(request: HttpRequest, slug: str, dataset_id: str) -> HttpResponse:
    """GET: a dataset and its versions. PATCH ``{"source", "licence", "description"}`` (any of them; members): what
    the dataset page's "About this dataset" changes, by the same service; all or nothing. DELETE: the dataset with
    every version and their files (an owner, or the member who made it and uploaded each version; a 400 naming the
    work that still reads one)."""
    if request.method == "GET":
        project, _membership = get_project_for_user(request.user, slug)
        return JsonResponse(_dataset_json(dataset_selectors.dataset_get(project=project, public_id=dataset_id),
                                          versions=True))
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    dataset = dataset_selectors.dataset_get(project=project, public_id=dataset_id)
    if request.method == "PATCH":
        body = _body(request, schemas.DatasetUpdate)
        dataset = dataset_services.dataset_about_update(dataset=dataset, user=request.user,
                                                        **body.model_dump(include=body.model_fields_set))
        return JsonResponse(_dataset_json(dataset, versions=True))
    dataset_selectors.ensure_may_delete_dataset(membership=membership, dataset=dataset,
                                                versions=list(dataset_selectors.version_list(dataset=dataset)))
    dataset_services.dataset_delete(dataset=dataset, actor=request.user)
    return HttpResponse(status=204)


@api_view(("GET",), query=("a", "b", *paging.QUERY))
def dataset_compare(request: HttpRequest, slug: str, dataset_id: str) -> JsonResponse:
    """GET: version ``a`` against version ``b`` (the dataset's comparison page as JSON; by default the latest ready
    version against the ready one before it): the counts of rows unchanged, removed and added, and a page of the
    removed rows' numbers in A and the added rows' in B (``limit`` of each, and the ``next`` link)."""
    project, _membership = get_project_for_user(request.user, slug)
    dataset = dataset_selectors.dataset_get(project=project, public_id=dataset_id)
    older, newer = dataset_selectors.comparison_versions(dataset=dataset, a=request.GET.get("a"),
                                                         b=request.GET.get("b"))
    differences = dataset_selectors.version_differences(a=older, b=newer)
    # The cursor holds the last removed and added rows given; it continues this pair of versions only.
    sort = f"rows of v{older.number} against v{newer.number}"
    asked = paging.page_query(request, sort=sort, default_limit=paging.ROWS_DEFAULT_LIMIT,
                              max_limit=paging.ROWS_MAX_LIMIT)
    removed_after, added_after = asked.after or (0, 0)
    removed, removed_last, more_removed = _rows_after(differences.removed, after=removed_after, limit=asked.limit)
    added, added_last, more_added = _rows_after(differences.added, after=added_after, limit=asked.limit)
    more = more_removed or more_added
    return JsonResponse({"a": _compared_json(older), "b": _compared_json(newer), "unchanged": differences.unchanged,
                         "removed": len(differences.removed), "added": len(differences.added),
                         "removed_rows": removed, "added_rows": added,
                         "next": paging.next_link(request, sort=sort, after=(removed_last, added_last) if more else None)})


def _rows_after(rows, *, after: int, limit: int) -> tuple[list[int], int, bool]:
    """The first ``limit`` of ``rows`` (ascending row numbers) past row ``after``, the last of them (``after`` when
    there is none) and whether more follow."""
    start = int(rows.searchsorted(after, side="right"))
    page = rows[start:start + limit].tolist()
    return page, page[-1] if page else after, start + limit < len(rows)


def _compared_json(version: DatasetVersion) -> dict[str, Any]:
    return {"id": version.public_id, "number": version.number, "row_count": version.row_count}


@api_view(("GET", "DELETE"))
def dataset_version(request: HttpRequest, slug: str, dataset_id: str, number: int) -> HttpResponse:
    """GET: one version of a dataset. DELETE: the version and its file (an owner, or the member who uploaded
    it; its number is not given again; a 400 naming the work that still reads it)."""
    project, membership = get_project_for_user(request.user, slug,
                                               min_role=Role.VIEWER if request.method == "GET" else Role.MEMBER)
    dataset = dataset_selectors.dataset_get(project=project, public_id=dataset_id)
    version = dataset_selectors.version_get(dataset=dataset, number=number)
    if request.method == "GET":
        return JsonResponse(_version_with_campaign_json(project, version))
    dataset_selectors.ensure_may_delete_version(membership=membership, version=version)
    dataset_services.dataset_version_delete(version=version, actor=request.user)
    return HttpResponse(status=204)


@api_view(("POST",))
def dataset_version_split(request: HttpRequest, slug: str, dataset_id: str, number: int) -> JsonResponse:
    """POST: split a ready version into a training and a held-out dataset, as its page's "Split into train and
    held-out" does (members; ``services.dataset_version_split``): 202 with the two new versions, which a worker writes
    and checks (poll them until ``ready`` or ``failed``); 400 naming each field refused, nothing saved. With an
    ``Idempotency-Key``, a repeat splits nothing again."""
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    version = dataset_selectors.version_get(dataset=dataset_selectors.dataset_get(project=project,
                                                                                  public_id=dataset_id), number=number)
    body = _body(request, schemas.DatasetVersionSplit)

    def split() -> str:
        train, held = dataset_services.dataset_version_split(version=version, user=request.user, **body.model_dump())
        return f"{train.public_id} {held.public_id}"

    sent = request_send_once(request, create=split)
    sides = [dataset_selectors.version_get_by_id(project=project, public_id=public_id)
             for public_id in sent.result.split()]
    return _created({side: _version_json(made) for side, made in zip(("train", "held_out"), sides)}, sent, status=202)


@api_view(("POST",))
def dataset_version_derive(request: HttpRequest, slug: str, dataset_id: str, number: int) -> JsonResponse:
    """POST: a new version of the dataset written from a ready version without its exact repeats (``kind`` dedupe) or
    without the rows version ``against`` shares with it (``kind`` decontaminate), as its page's "Remove the exact
    repeats" and "Remove rows shared with another version" do (members; ``services.dataset_version_derive``): 202
    with the new version, which a worker writes and checks (poll it until ``ready`` or ``failed``); 400 naming the
    field refused (``version`` where it has no repeats), nothing saved. With an ``Idempotency-Key``, a repeat makes
    nothing again."""
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    version = dataset_selectors.version_get(dataset=dataset_selectors.dataset_get(project=project,
                                                                                  public_id=dataset_id), number=number)
    body = _body(request, schemas.DatasetVersionDerive)

    def derive() -> str:
        return dataset_services.dataset_version_derive(version=version, user=request.user, **body.model_dump()
                                                       ).public_id

    sent = request_send_once(request, create=derive)
    made = dataset_selectors.version_get_by_id(project=project, public_id=sent.result)
    return _created(_version_json(made), sent, status=202)


@api_view(("GET",))
def dataset_version_by_id(request: HttpRequest, slug: str, version_id: str) -> JsonResponse:
    """GET: a version by its dv_… id, the one a run's spec names (``datasets/<ds id>/versions/<n>/`` names it by its
    dataset and number): the same answer."""
    project, _membership = get_project_for_user(request.user, slug)
    version = dataset_selectors.version_get_by_id(project=project, public_id=version_id)
    return JsonResponse(_version_with_campaign_json(project, version))


def _version_with_campaign_json(project: Project, version: DatasetVersion) -> dict[str, Any]:
    """A version as read alone, with the review campaign it was exported from."""
    campaign = review_selectors.export_campaigns(project=project, versions=[version]).get(version.pk)
    return _version_json(version, review_campaign=campaign)


@api_view(("GET",))
def dataset_version_file(request: HttpRequest, slug: str, dataset_id: str, number: int) -> HttpResponse:
    """GET: the file of a ready version, byte for byte as it was uploaded, under its original name."""
    project, _membership = get_project_for_user(request.user, slug)
    dataset = dataset_selectors.dataset_get(project=project, public_id=dataset_id)
    version = dataset_selectors.version_get(dataset=dataset, number=number)
    if version.status == VersionStatus.FAILED:
        raise Http404(f"version {number} of {isolated(dataset.name)} failed its check and keeps no file; fix the "
                      "file and upload it again")
    if version.status != VersionStatus.READY:
        raise Http404(f"version {number} of {isolated(dataset.name)} is {version.status}: only a ready version has "
                      "a file to download; wait for its check to end")
    if not version.absolute_path.is_file():
        raise Http404(f"the file of version {number} of {isolated(dataset.name)} is gone from storage")
    # Streamed (webapp.core.streaming), as the version page's Download link is.
    return file_download(version.absolute_path, filename=version.original_filename, label=download_label(request),
                         access_lost=_token_access_lost(
        request, lambda account: dataset_selectors.version_get(
            dataset=dataset_selectors.dataset_get(project=get_project_for_user(account, slug)[0], public_id=dataset_id),
            number=number)))


@api_view(("GET", "POST"), query=(*run_selectors.RunFilters.QUERY, *paging.QUERY))
def runs(request: HttpRequest, slug: str) -> JsonResponse:
    """GET: the project's runs (query as on the runs table: q, status, task, tag, archived, sort),
    a page at a time (``limit``, and the ``next`` link: see ``webapp.api.paging``). POST: launch a
    run from a spec, or open an external run."""
    if request.method == "GET":
        project, _membership = get_project_for_user(request.user, slug)
        filters = run_selectors.RunFilters.from_api_query(request.GET)
        asked = paging.page_query(request, sort=filters.sort)
        page = run_selectors.run_page(project=project, filters=filters, after=asked.after, limit=asked.limit)
        return JsonResponse({"runs": [_run_json(run) for run in page.rows],
                             "next": paging.next_link(request, sort=filters.sort, after=page.next_after)})
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    body = _body(request, schemas.RunCreate)

    def launch() -> str:
        if body.external:
            return run_services.run_create_external(project=project, name=body.name, config=body.config,
                                                    user=request.user, tags=body.tags).public_id
        spec = body.spec if body.spec is not None else run_services.spec_from_yaml(body.spec_yaml)
        if body.sweep is not None:
            return run_services.sweep_create(project=project, spec=spec, user=request.user, name=body.name,
                                             tags=body.tags, axes=sweeps.axes_from_mapping(body.sweep),
                                             for_api=True).tag
        return run_services.run_create(project=project, spec=spec, user=request.user, name=body.name,
                                       tags=body.tags, for_api=True).public_id

    sent = request_send_once(request, create=launch)
    if body.sweep is not None:  # what the sending made is the sweep's tag (a repeat finds its runs by it)
        return _created({"sweep": sent.result, "runs": [_run_detail_json(request, run) for run in
                                                        run_selectors.sweep_runs(project=project, tag=sent.result)]},
                        sent)
    return _created(_launched_run_json(request, project, sent.result), sent)


@api_view(("GET", "PATCH", "DELETE"))
def run_detail(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    """GET: a run. PATCH ``{"name", "tags", "notes", "archived"}`` (any of them): what the run page's edit form
    and archive button change, by the same services and rules; all or nothing. DELETE: the run and its files
    (an owner, or the member who launched it; a 400 naming what still needs it, the run itself while it is
    queued or running)."""
    _project, membership, run = get_run_for_user(request.user, slug, run_id, write=request.method != "GET")
    if request.method == "GET":
        return JsonResponse(_run_detail_json(request, run))
    if request.method == "PATCH":
        body = _body(request, schemas.RunUpdate)
        details = {key: getattr(body, key) for key in ("name", "tags", "notes") if key in body.model_fields_set}
        with transaction.atomic():
            # Archived first: a refusal names the run, and after a rename in this transaction it named the run by
            # the name it was refused (rolled back), not the one it has.
            if body.archived is not None:
                with _fields_as_sent({"runs": "archived"}):
                    run_services.run_set_archived(runs=[run], archived=body.archived, actor=request.user)
            if details:
                run_services.run_update_details(run=run, **details)
        run.refresh_from_db()
        return JsonResponse(_run_detail_json(request, run))
    run_selectors.ensure_may_delete_run(membership=membership, run=run)
    run_services.run_delete(run=run, actor=request.user)
    return HttpResponse(status=204)


@api_view(("POST",))
def run_cancel(request: HttpRequest, slug: str, run_id: str) -> JsonResponse:
    _project, _membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    return JsonResponse(_run_json(run_services.run_cancel(run=run, user=request.user)))


@api_view(("POST",))
def run_resume(request: HttpRequest, slug: str, run_id: str) -> JsonResponse:
    _project, _membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    body = _body(request, schemas.RunResume)
    return JsonResponse(_run_json(run_services.run_resume(run=run, user=request.user, max_steps=body.max_steps,
                                                          for_api=True)))


@api_view(("POST",))
def run_retry(request: HttpRequest, slug: str, run_id: str) -> JsonResponse:
    """The run page's Retry: the run's spec started over as a new run (``services.run_retry``, its refusals too);
    201 with the new run."""
    project, _membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    _body(request, schemas.RunRetry)  # no field: one sent (max_steps is resume's) is refused, not ignored
    sent = request_send_once(request, create=lambda: run_services.run_retry(run=run, user=request.user,
                                                                            for_api=True).public_id)
    return _created(_launched_run_json(request, project, sent.result), sent)


@api_view(("POST",))
def run_duplicate(request: HttpRequest, slug: str, run_id: str) -> JsonResponse:
    """The run page's Duplicate, launched: the run's spec as that launch form is filled with, ``spec`` (a partial
    spec) merged onto it, launched as ``POST runs/`` launches (``services.run_duplicate``); 201 with the new run."""
    project, _membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    body = _body(request, schemas.RunDuplicate)
    sent = request_send_once(request, create=lambda: run_services.run_duplicate(
        run=run, user=request.user, spec_changes=body.spec, name=body.name, tags=body.tags).public_id)
    return _created(_launched_run_json(request, project, sent.result), sent)


def _launched_run_json(request: HttpRequest, project: Project, public_id: str) -> dict[str, Any]:
    run, = run_selectors.runs_by_ids(project=project, public_ids=[public_id])
    return _run_detail_json(request, run)


@api_view(("POST",))
def run_finish(request: HttpRequest, slug: str, run_id: str) -> JsonResponse:
    """Close an external run."""
    _project, _membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    body = _body(request, schemas.RunFinish)
    return JsonResponse(_run_json(run_services.run_finish_external(run=run, status=body.status, message=body.message)))


@api_view(("GET", "POST"), query=("names", "after_step", "max_points"))
def run_metrics(request: HttpRequest, slug: str, run_id: str) -> JsonResponse:
    """GET: ``{"series": {name: {step, value, tokens, time}}, "unknown_names": [...], "metric_names": [...]}``
    (``names`` comma-separated, ``after_step``, ``max_points`` for server-side downsampling): ``unknown_names`` the
    names asked for that the run has logged no point of (a typo answered only ``{}``), ``metric_names`` those it
    has. POST (external runs): log points."""
    if request.method == "POST":
        _project, _membership, run = get_run_for_user(request.user, slug, run_id, write=True)
        body = _body(request, schemas.MetricsLog)
        logged = run_services.metrics_log(run=run, points=[point.model_dump() for point in body.points])
        return JsonResponse(dataclasses.asdict(logged), status=201)
    # Read only by a whole run's series: a script following a run (after_step) leaves it unread.
    _project, _membership, run = get_run_for_user(request.user, slug, run_id, series_cache=False)
    names = [name for name in request.GET.get("names", "").split(",") if name]
    errors = {}
    # -1 is allowed: points after step -1 include those logged at step 0
    after_step = whole_number(request.GET.get("after_step") or str(run_selectors.BEFORE_FIRST_STEP), signed=True)
    if after_step is None:
        errors["after_step"] = (f"{request.GET['after_step']!r} is not a step; give a whole number up to "
                                f"{MAX_STORED_INT} (only points after that step come back), or leave it out")
    # 0 and 1 were taken as 2, and more than the maximum as the maximum, without a word
    max_points = whole_number(request.GET.get("max_points") or str(run_selectors.MAX_POINTS),
                              maximum=run_selectors.METRICS_MAX_POINTS)
    if max_points is None or max_points < 2:
        errors["max_points"] = (f"{request.GET['max_points']!r} is not a number of points; give a whole number from 2 "
                                f"to {run_selectors.METRICS_MAX_POINTS} ({run_selectors.MAX_POINTS} when left out)")
    if errors:
        raise ValidationError(errors)
    series = run_selectors.metric_series(run=run, names=names or None, after_step=after_step, max_points=max_points)
    # Beside the series, not among them: a metric may be named anything, these keys too.
    # The series read may hold points whose run row is not yet saved with their names (a worker writes both).
    logged = sorted({*run_selectors.run_metric_names(run=run), *series})
    return JsonResponse({"series": series, "unknown_names": [name for name in names if name not in logged],
                         "metric_names": logged})


@api_view(("GET", "POST"), query=("step", *paging.QUERY))
def run_samples(request: HttpRequest, slug: str, run_id: str) -> JsonResponse:
    """GET: samples (``step`` to choose one), a page at a time (``limit``, and the ``next`` link). POST (external
    runs): log generations."""
    if request.method == "POST":
        _project, _membership, run = get_run_for_user(request.user, slug, run_id, write=True)
        body = _body(request, schemas.SamplesLog)
        stored = run_services.samples_log(run=run, samples=[sample.model_dump() for sample in body.samples])
        return JsonResponse({"stored": stored}, status=201)
    _project, _membership, run = get_run_for_user(request.user, slug, run_id)
    step = request.GET.get("step") or None
    if step is not None and whole_number(step) is None:
        raise ValidationError({"step": f"{step!r} is not a step; give a whole number from 0 to {MAX_STORED_INT}, "
                                       "or leave step out for every step"})
    asked = paging.page_query(request, sort="samples", default_limit=paging.SAMPLES_DEFAULT_LIMIT,
                              max_limit=paging.SAMPLES_MAX_LIMIT)
    page = run_selectors.sample_page(run=run, step=whole_number(step), after=asked.after, limit=asked.limit)
    return JsonResponse({"samples": [{"step": sample.step, "position": sample.position, "prompt": sample.prompt,
                                      "text": sample.text, "answer": sample.answer, "rewards": sample.rewards,
                                      "reward": sample.reward} for sample in page.rows],
                         "next": paging.next_link(request, sort="samples", after=page.next_after)})


@api_view(("GET",), query=("after", "limit", "tail"))
def run_logs(request: HttpRequest, slug: str, run_id: str) -> JsonResponse:
    """GET: the run's log (the run page's Log: what the launch and the worker wrote), oldest first: the first
    ``limit`` lines after the line ``after`` (an id; 0 or left out: from the first line), or with ``tail=N``
    the last N lines after it, as the run page opens on. ``next`` reads on after the last line given; it is
    null once the run has ended and its log is read to the end, so a script follows it (waiting a while after
    an empty page) to follow a running run."""
    _project, _membership, run = get_run_for_user(request.user, slug, run_id)
    ended = not run.is_active  # read before the lines: every line of a run that had ended is written by then
    errors = {}
    after = whole_number(request.GET.get("after") or "0")
    if after is None:
        errors["after"] = (f"{request.GET['after']!r} is not a line id; give the id of the last line you have (0, "
                           "or leave after out, for the first line)")
    limits = {name: whole_number(request.GET[name], maximum=paging.LOG_MAX_LIMIT) for name in ("limit", "tail")
              if name in request.GET}
    for name, what in (("limit", f"the first lines after after; {paging.LOG_DEFAULT_LIMIT} when left out"),
                       ("tail", "the last lines")):
        if name in limits and not limits[name]:
            errors[name] = (f"{request.GET[name]!r} is not a number of lines; give a whole number from 1 to "
                            f"{paging.LOG_MAX_LIMIT} ({what})")
    if len(limits) == 2 and not errors:
        errors["tail"] = "give tail (the last lines) or limit (the first lines after after), not both"
    if errors:
        raise ValidationError(errors)
    tail = limits.get("tail")
    lines = run_selectors.log_tail(run=run, after_id=after, newest=tail is not None,
                                   limit=tail or limits.get("limit", paging.LOG_DEFAULT_LIMIT))
    last = lines[-1].pk if lines else after
    next_link = None
    if not ended or run_selectors.log_has_lines_after(run=run, after_id=last):
        query = request.GET.copy()
        query["after"] = str(last)
        query.pop("tail", None)
        next_link = request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
    return JsonResponse({"lines": [reporting.log_line_payload(line) for line in lines], "next": next_link})


@api_view(("GET",), query=("step",))
def run_artifact(request: HttpRequest, slug: str, run_id: str, kind: str) -> HttpResponse:
    """Download an artifact directory (``model``, ``adapter``, or ``checkpoint`` with ``?step=N``) as a tar."""
    _project, _membership, run = get_run_for_user(request.user, slug, run_id)
    artifact = artifacts.artifact_to_download(run=run, kind=kind, step=request.GET.get("step"))
    return artifacts.artifact_tar_response(run=run, artifact=artifact, label=download_label(request),
                                           access_lost=_token_access_lost(
        request, lambda account: get_run_for_user(account, slug, run_id)))


@api_view(("GET",), query=("step",))
def run_artifact_card(request: HttpRequest, slug: str, run_id: str, kind: str) -> HttpResponse:
    """The model card (``README.md``) the engine wrote into an artifact (``model``, ``adapter``, or ``checkpoint`` with
    ``?step=N``), as Markdown: what the run page's *Model card* shows; 404 saying why for one without (as that page)."""
    _project, _membership, run = get_run_for_user(request.user, slug, run_id)
    artifact = artifacts.artifact_to_download(run=run, kind=kind, step=request.GET.get("step"))
    return HttpResponse(artifacts.model_card_text(artifact), content_type="text/markdown; charset=utf-8")


@api_view(("DELETE",))
def run_checkpoint(request: HttpRequest, slug: str, run_id: str, step: int) -> HttpResponse:
    """DELETE: the training checkpoint ``step`` (``checkpoints/<step>``) of a run that has ended, to free its disk,
    as the run page's Delete under Checkpoints does (who may delete the run): 204; 409 saying why not and what to do
    instead, nothing changed; 404 for a step the run's folder holds no checkpoint of."""
    _project, membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    run_selectors.ensure_may_delete_run(membership=membership, run=run)
    try:
        run_services.checkpoint_delete(run=run, step=step, user=request.user)
    except ValidationError as error:
        return _error(409, detail="; ".join(error.messages))
    return HttpResponse(status=204)


@api_view(("GET",))
def run_checkpoints(request: HttpRequest, slug: str, run_id: str) -> JsonResponse:
    """GET: the run's checkpoints as its page's Checkpoints lists them (``selectors.checkpoint_list``, every member):
    each with its disk, export, score, serving copy and, for who may delete the run, its ``deletion``."""
    _project, membership, run = get_run_for_user(request.user, slug, run_id)
    may_delete = run_selectors.may_delete_run(membership=membership, run=run)
    listed = run_selectors.checkpoint_list(run=run, deletions=may_delete)
    return JsonResponse({"checkpoints": [_checkpoint_json(request, run, checkpoint) for checkpoint in listed]})


def _checkpoint_model(run: Run, checkpoint: dict[str, Any]) -> str | None:
    """The model a spec names to start from the checkpoint's weights: its export, or the run's final model (named by
    the run: ``services.final_model_step``); None while neither is there."""
    if checkpoint["artifact"] is not None:
        return f"{run.public_id}@{checkpoint['step']}"
    return run.public_id if checkpoint["final"] else None


def _checkpoint_json(request: HttpRequest, run: Run, checkpoint: dict[str, Any]) -> dict[str, Any]:
    artifact, export, score = checkpoint["artifact"], checkpoint["export"], checkpoint["score"]
    return {"step": checkpoint["step"],
            "saved_at": checkpoint["saved_at"].isoformat() if checkpoint["saved_at"] else None,
            "size_bytes": checkpoint["size_bytes"], "model": _checkpoint_model(run, checkpoint),
            "download_url": _artifact_url(request, run, artifact) if artifact is not None else None,
            "card_url": _card_url(request, run, artifact) if artifact is not None else None,
            "export": _checkpoint_export_json(export, exported=artifact is not None),
            "final": checkpoint["final"],
            "score": {key: score[key] for key in ("metric", "value", "at", "best")} if score else None,
            "serving_copy": _serving_copy_json(checkpoint["serving_copy"]),
            "deletion": checkpoint.get("deletion")}


def _checkpoint_export_json(export, *, exported: bool) -> dict[str, Any] | None:
    """The last export asked for, as ``selectors.checkpoint_states`` judges it: exported once its artifact is
    recorded, whatever the row says (an export recorded without one: a run's, or one from before the rows)."""
    if export is None and not exported:
        return None
    return {"status": "exported" if exported else export.status,
            "error_message": "" if exported or export is None else export.error_message,
            "notice": "" if exported or export is None else export.notice}


def _serving_copy_json(copy: dict[str, Any] | None) -> dict[str, Any] | None:
    """``serving_copies.copy_state`` without its row and figures: what its state line on the run page says."""
    if copy is None:
        return None
    return {"state": copy["state"], "scheme": str(copy.get("scheme", "")), "served": copy["served"],
            "message": copy.get("message") or copy.get("note") or ""}


def _sent_once_or_refused(request: HttpRequest, *, create: Callable[[], str],
                          missing: Callable[[str], str]) -> Sent | JsonResponse:
    """``request_send_once`` of a checkpoint's action, whose service refuses with a ``ValidationError``: a 409 saying
    why, or a 404 where ``missing(refusal)`` says the step is not there ("" when it is)."""
    try:
        return request_send_once(request, create=create)
    except SendingInProgress:  # a ValidationError too, answered 409 by api_view with its own words
        raise
    except ValidationError as error:
        refusal = "; ".join(error.messages)
        if why_missing := missing(refusal):
            raise Http404(why_missing) from None
        return _error(409, detail=refusal)


def _unlisted_checkpoint(run: Run, step: int) -> str:
    """Why ``step`` names no checkpoint of ``run`` (neither in its folder nor exported, as ``checkpoint_list`` lists
    them), naming those there are; "" for one listed."""
    listed = sorted({*run_services.checkpoint_steps(run),
                     *run.artifacts.filter(kind=ArtifactKind.CHECKPOINT).values_list("step", flat=True)})
    if step in listed:
        return ""
    return f"run {run.public_id} has no checkpoint {step}; it has {', '.join(map(str, listed)) or 'none'}"


@api_view(("POST",))
def run_checkpoint_export(request: HttpRequest, slug: str, run_id: str, step: int) -> JsonResponse:
    """POST: export checkpoint ``step`` as a starting model, as the run page's *Export as a starting model* does (a
    member or owner; ``services.checkpoint_export_request``): 202 with the export, which the train queue writes,
    other runs then naming ``run_…@<step>`` as their model; 409 saying why not (the run has not finished, it is
    exported, its training checkpoint deleted since or not, being exported, or the final model); 404 for a step the
    run has neither a checkpoint nor an export of. With an ``Idempotency-Key``, a repeat queues nothing again."""
    _project, _membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    _body(request, schemas.CheckpointExport)  # no field: one sent is refused, not ignored

    def export() -> str:
        run_services.checkpoint_export_request(run=run, step=step, user=request.user)
        return str(step)

    sent = _sent_once_or_refused(request, create=export, missing=lambda _refusal: _unlisted_checkpoint(run, step))
    if isinstance(sent, JsonResponse):
        return sent
    # Read now: a repeat with the first's key answers the export as it stands (exported since, perhaps).
    exported = run.artifacts.filter(kind=ArtifactKind.CHECKPOINT, step=step).exists()
    export_row = run.checkpoint_exports.filter(step=step).first()
    return _created({"step": step, "model": f"{run.public_id}@{step}",
                     "export": _checkpoint_export_json(export_row, exported=exported)}, sent, status=202)


@api_view(("POST",))
def run_checkpoint_serving_copy(request: HttpRequest, slug: str, run_id: str, step: int) -> JsonResponse:
    """POST ``{"scheme": "int8"}`` (or ``int4``; optional): make the quantized serving copy of exported checkpoint
    ``step``, which the chat and ``/v1/`` then serve for ``run_…@<step>``, as the run page's button beside an exported
    checkpoint does (a member or owner; ``serving_copies.serving_copy_request``): 202 with the copy's state and whether
    this request queued it (asked again while it is written, nothing more is queued; a ready or failed one is made
    again); 409 saying why not (not exported yet, a reward model, its export's folder gone); 404 for a step the run
    has no checkpoint of. With an ``Idempotency-Key``, a repeat queues nothing again."""
    _project, _membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    body = _body(request, schemas.CheckpointServingCopy)

    def make() -> str:
        _copy, queued = serving_copies.serving_copy_request(project=run.project, user=request.user, run=run,
                                                            step=step, scheme=body.scheme)
        return "queued" if queued else ""

    sent = _sent_once_or_refused(request, create=make, missing=lambda _refusal: _unlisted_checkpoint(run, step))
    if isinstance(sent, JsonResponse):
        return sent
    artifact = run.artifacts.get(kind=ArtifactKind.CHECKPOINT, step=step)
    copy = serving_copies.checkpoint_serving_copies(run=run, artifacts={step: artifact})[step]
    return _created({"step": step, "queued": sent.result == "queued",
                     "serving_copy": _serving_copy_json(copy)}, sent, status=202)


@api_view(("POST",))
def run_checkpoints_prune(request: HttpRequest, slug: str, run_id: str) -> JsonResponse:
    """POST ``{"keep": [steps]}`` (optional): delete every training checkpoint of a run that has ended but the
    newest, the best and the pinned steps, as the run page's *Delete the others…* does (who may delete the run):
    what was deleted and kept; 409 saying why not, nothing changed; 400 naming a pinned step not in the folder."""
    _project, membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    run_selectors.ensure_may_delete_run(membership=membership, run=run)
    body = _body(request, schemas.CheckpointsPrune)
    try:
        pruned = run_services.checkpoints_prune(run=run, user=request.user, keep=body.keep)
    except ValidationError as error:
        if "run" in error.message_dict:
            return _error(409, detail="; ".join(error.messages))
        raise
    return JsonResponse({
        "deleted": [{"step": deleted.step, "bytes": deleted.bytes_freed} for deleted in pruned.deleted],
        "kept": [{"step": step, "reasons": reasons} for step, reasons in pruned.kept.items()],
        "bytes_freed": pruned.bytes_freed})


def _pipeline_json(pipeline) -> dict[str, Any]:
    runs = {run.pipeline_stage: run.public_id for run in pipeline.runs.all()}
    return {"id": pipeline.public_id, "name": pipeline.name, "status": pipeline.status,
            "current_stage": pipeline.current_stage, "message": pipeline.message,
            "result_run": pipeline.result_run.public_id if pipeline.result_run else None,
            "cancelled_by": pipeline.cancelled_by,
            "stages": [{**stage, "run": runs.get(index)} for index, stage in enumerate(pipeline.stages)]}


@api_view(("GET", "POST"), query=paging.QUERY)
def pipelines(request: HttpRequest, slug: str) -> JsonResponse:
    """GET: the project's pipelines, newest first, a page at a time (``limit``, and the ``next`` link). POST ``{"name": ..., "stages": [{"name", "spec", "guard"?}]}``:
    validate every stage and start the first."""
    from webapp.runs import pipelines as pipeline_services

    if request.method == "GET":
        project, _membership = get_project_for_user(request.user, slug)
        asked = paging.page_query(request, sort="pipelines")
        page = run_selectors.pipeline_page(project=project, after=asked.after, limit=asked.limit)
        return JsonResponse({"pipelines": [_pipeline_json(pipeline) for pipeline in page.rows],
                             "next": paging.next_link(request, sort="pipelines", after=page.next_after)})
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    document = _json_body(request)
    sent = request_send_once(request, create=lambda: pipeline_services.pipeline_create(
        project=project, document=document, user=request.user).public_id)
    return _created(_pipeline_json(run_selectors.pipeline_get(project=project, public_id=sent.result)), sent)


def _activity_json(request: HttpRequest, row: activity_selectors.ActivityRow) -> dict[str, Any]:
    entry, target = row.entry, row.target
    return {"id": entry.pk, "created_at": entry.created_at.isoformat(), "actor": entry.actor_name or None,
            "actor_shown": row.actor, "verb": entry.verb, "details": entry.details,
            "target": {"kind": entry.target_kind, "id": entry.target_id, "label": entry.target_label,
                       "exists": target.exists,
                       "url": request.build_absolute_uri(target.address) if target.address else None}
            if target is not None else None}


@api_view(("GET",), query=(*paging.QUERY, *activity_selectors.FILTER_QUERY))
def activity(request: HttpRequest, slug: str) -> JsonResponse:
    """The project's activity log, newest first, a page at a time (``limit``, and the ``next`` link); ``actor``
    (a username), ``action`` (what was done, the page's word) and ``kind`` (of object) filter it. Every member reads
    it, viewers too."""
    project, membership = get_project_for_user(request.user, slug)
    filters = activity_selectors.ActivityFilters.from_query(request.GET)
    asked = paging.page_query(request, sort="activity")
    page = activity_selectors.activity_page(project=project, filters=filters, after=asked.after, limit=asked.limit)
    rows = activity_selectors.activity_rows(project=project, entries=page.rows, role=membership.role)
    return JsonResponse({"activity": [_activity_json(request, row) for row in rows],
                         "next": paging.next_link(request, sort="activity", after=page.next_after)})


def _chat_token_json(token: ProjectToken) -> dict[str, Any]:
    return {"id": token.pk, "name": token.name, "prefix": token.prefix, "created_at": token.created_at.isoformat(),
            "last_used_at": token.last_used_at.isoformat() if token.last_used_at else None,
            "expires_at": token.expires_at.isoformat() if token.expires_at else None, "expired": token_expired(token)}


@api_view(("GET", "POST"))
def chat_tokens(request: HttpRequest, slug: str) -> JsonResponse:
    """GET: the caller's own tokens of the OpenAI-compatible API (``/v1/``) for the project, without secrets. POST
    ``{"name", "expires"}``: make one, as the Chat page does (a member or owner: chatting spends accelerator time), so
    that a script holding a REST token can chat; its secret is in this answer only (a repeat with the first's
    ``Idempotency-Key`` makes none and answers the token without it)."""
    project, _membership = chat_access(request.user, slug)
    if request.method == "GET":
        return JsonResponse({"tokens": [_chat_token_json(token)
                                        for token in project_token_list(user=request.user, project=project)]})
    body = _body(request, schemas.ChatTokenCreate)
    expires_at = token_expiry(body.expires)

    def create() -> tuple[str, str]:
        token, secret = project_token_create(user=request.user, project=project, name=body.name,
                                             expires_at=expires_at)
        return str(token.pk), secret

    sent, secret = request_send_once_secret(request, create=create)
    token = project_token_list(user=request.user, project=project).filter(pk=int(sent.result)).first()
    if token is None:  # a repeat of a request whose token was revoked since
        raise Http404("the token this Idempotency-Key made has been revoked since; send another key to make a new one")
    base_url = request.build_absolute_uri(reverse("chat:v1_models")).removesuffix("/models")
    return _created({**_chat_token_json(token), "token": secret or None, "base_url": base_url}, sent)


@api_view(("DELETE",))
def chat_token(request: HttpRequest, slug: str, token_id: int) -> HttpResponse:
    """DELETE: revoke one of the caller's tokens for the project, as the Chat page's Revoke does."""
    project, _membership = chat_access(request.user, slug)
    if project_token_revoke(user=request.user, project=project, token_id=token_id) is None:
        raise Http404("no token of yours in this project has that id (revoked already?)")
    return HttpResponse(status=204)


@api_view(("GET",))
def pipeline_detail(request: HttpRequest, slug: str, pipeline_id: str) -> JsonResponse:
    project, _membership = get_project_for_user(request.user, slug)
    return JsonResponse(_pipeline_json(run_selectors.pipeline_get(project=project, public_id=pipeline_id)))


@api_view(("POST",))
def pipeline_cancel(request: HttpRequest, slug: str, pipeline_id: str) -> JsonResponse:
    """Cancel a running pipeline: its current stage's run, or its export stage not yet writing."""
    from webapp.runs import pipelines as pipeline_services

    project, membership = get_project_for_user(request.user, slug)
    run_selectors.ensure_may_cancel_pipeline(membership=membership)
    pipeline = run_selectors.pipeline_get(project=project, public_id=pipeline_id)
    pipeline_services.pipeline_cancel(pipeline=pipeline, user=request.user)
    return JsonResponse(_pipeline_json(run_selectors.pipeline_get(project=project, public_id=pipeline_id)))


def _owned_webhook(request: HttpRequest, slug: str, webhook_id: str) -> Webhook:
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    return webhook_selectors.webhook_get(project=project, public_id=webhook_id)


def _webhook_json(request: HttpRequest, webhook: Webhook) -> dict[str, Any]:
    deliveries = reverse("api:webhook_deliveries", kwargs={"slug": webhook.project.slug,
                                                           "webhook_id": webhook.public_id})
    return {"id": webhook.public_id, "url": webhook.url, "events": webhook.events, "format": webhook.format,
            "active": webhook.active, "secret": webhook.secret, "created_at": webhook.created_at.isoformat(),
            "deliveries_url": request.build_absolute_uri(deliveries)}


def _delivery_json(delivery: WebhookDelivery) -> dict[str, Any]:
    return {"id": delivery.public_id, "event": delivery.event, "status": delivery.status,
            "attempts": delivery.attempts, "last_status_code": delivery.last_status_code,
            "last_error": delivery.last_error, "last_response": delivery.last_response,
            "next_attempt_at": delivery.next_attempt_at.isoformat() if delivery.next_attempt_at else None,
            "created_at": delivery.created_at.isoformat(), "payload": delivery.payload}


@api_view(("GET", "POST"))
def webhooks(request: HttpRequest, slug: str) -> JsonResponse:
    """The project's webhooks, as its Webhooks page (owners only: members and viewers get 403, a hook's address and
    its secret being secrets). GET: every hook, with its secret. POST ``{"url", "events", "format"?, "active"?}``: add
    one (``webhooks.services.webhook_create``, the page's checks); 201 with the hook and its secret."""
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.OWNER)
    if request.method == "GET":
        return JsonResponse({"webhooks": [_webhook_json(request, webhook)
                                          for webhook in webhook_selectors.webhook_list(project=project)]})
    body = _body(request, schemas.WebhookCreate)
    sent = request_send_once(request, create=lambda: webhook_services.webhook_create(
        project=project, user=request.user, site_url=webhook_services.served_at(request), **body.model_dump()).public_id)
    return _created(_webhook_json(request, webhook_selectors.webhook_get(project=project, public_id=sent.result)),
                    sent)


@api_view(("GET", "PATCH", "DELETE"))
def webhook_detail(request: HttpRequest, slug: str, webhook_id: str) -> HttpResponse:
    """GET: a hook. PATCH ``{"url", "events", "format", "active"}`` (any of them): what the page's Edit changes, by
    the same service and checks; all or nothing. DELETE: the hook and its deliveries (owners only, all three)."""
    webhook = _owned_webhook(request, slug, webhook_id)
    if request.method == "PATCH":
        body = _body(request, schemas.WebhookUpdate)
        fields = {"url": webhook.url, "events": webhook.events, "format": webhook.format, "active": webhook.active}
        webhook = webhook_services.webhook_update(webhook=webhook, user=request.user,
                                                  site_url=webhook_services.served_at(request),
                                                  **fields | body.model_dump(include=body.model_fields_set))
    elif request.method == "DELETE":
        webhook_services.webhook_delete(webhook=webhook, user=request.user)
        return HttpResponse(status=204)
    return JsonResponse(_webhook_json(request, webhook))


@api_view(("POST",))
def webhook_secret(request: HttpRequest, slug: str, webhook_id: str) -> JsonResponse:
    """The page's *New secret…*: messages from now on are signed with a new secret, which this answer holds."""
    webhook = _owned_webhook(request, slug, webhook_id)
    _body(request, schemas.WebhookSecret)
    return JsonResponse(_webhook_json(request, webhook_services.webhook_secret_regenerate(webhook=webhook, user=request.user)))


@api_view(("POST",))
def webhook_test(request: HttpRequest, slug: str, webhook_id: str) -> JsonResponse:
    """The page's *Send test*: a ``ping`` sent now (``webhooks.services.webhook_ping``); 201 with the delivery as it
    was sent (delivered, or pending a retry, or failed, with the answer's status and error)."""
    webhook = _owned_webhook(request, slug, webhook_id)
    _body(request, schemas.WebhookTest)
    return JsonResponse(_delivery_json(webhook_services.webhook_ping(webhook=webhook)), status=201)


@api_view(("GET",), query=paging.QUERY)
def webhook_deliveries(request: HttpRequest, slug: str, webhook_id: str) -> JsonResponse:
    """A hook's deliveries, newest first, a page at a time (``limit``, and the ``next`` link)."""
    webhook = _owned_webhook(request, slug, webhook_id)
    asked = paging.page_query(request, sort="deliveries")
    page = webhook_selectors.delivery_page(webhook=webhook, after=asked.after, limit=asked.limit)
    return JsonResponse({"deliveries": [_delivery_json(delivery) for delivery in page.rows],
                         "next": paging.next_link(request, sort="deliveries", after=page.next_after)})


@api_view(("POST",))
def webhook_redeliver(request: HttpRequest, slug: str, webhook_id: str, delivery_id: str) -> JsonResponse:
    """The page's *Redeliver*: the delivery's recorded payload sent now as a new delivery (the hook's current address,
    format and secret); 201 with that delivery as it was sent."""
    webhook = _owned_webhook(request, slug, webhook_id)
    delivery = webhook_selectors.delivery_get(webhook=webhook, public_id=delivery_id)
    _body(request, schemas.DeliveryRedeliver)
    return JsonResponse(_delivery_json(webhook_services.delivery_redeliver(delivery=delivery)), status=201)


@csrf_exempt  # read-only; other methods get a JSON 405, not the CSRF check's HTML page
def openapi(request: HttpRequest) -> JsonResponse:
    """The OpenAPI 3.1 document (public: it describes the API, not any data)."""
    from webapp.api.openapi import build_document

    if request.method not in ("GET", "HEAD"):
        return _method_not_allowed(request, ("GET", "HEAD"))
    return JsonResponse(build_document())


def _evaluation_json(evaluation) -> dict[str, Any]:
    version = evaluation.dataset_version
    return {"id": evaluation.public_id, "model": evaluation.model_ref, "model_label": evaluation.model_label,
            "dataset_version": version.public_id if version is not None else None,
            "version_label": evaluation.version_label, "metric": evaluation.metric, "row_limit": evaluation.row_limit,
            "max_new_tokens": evaluation.max_new_tokens, "group_by": evaluation.group_by,
            "answer_column": evaluation.answer_column, "reward_terms": evaluation.reward_terms,
            "status": evaluation.status, "rows_done": evaluation.rows_done, "rows_total": evaluation.rows_total,
            "result": evaluation.result, "error": evaluation.error,
            "created_by": evaluation.created_by.get_username() if evaluation.created_by else None,
            "created_at": evaluation.created_at.isoformat(),
            "started_at": evaluation.started_at.isoformat() if evaluation.started_at else None,
            "finished_at": evaluation.finished_at.isoformat() if evaluation.finished_at else None}


@api_view(("GET", "POST"), query=("model", *paging.QUERY))
def evaluations(request: HttpRequest, slug: str) -> JsonResponse:
    """GET: the project's evaluations, newest first, a page at a time (``limit``, and the ``next`` link); with
    ``model`` (a base model's or a run's id, a run's covering its checkpoints), that model's alone. POST
    ``{"model", "dataset_version", "row_limit"?, "max_new_tokens"?, "group_by"?, "answer_column"?, "reward_terms"?}``:
    check everything and queue the evaluation on the serve worker (202), as the New evaluation page does (members and
    owners); with ``"run"`` in place of ``"model"``, every model of that run (``_evaluate_every_checkpoint``)."""
    if request.method == "GET":
        project, _membership = get_project_for_user(request.user, slug)
        asked = paging.page_query(request, sort="evaluations")
        page = evaluation_selectors.evaluation_page(project=project, after=asked.after, limit=asked.limit,
                                                    model_id=request.GET.get("model", "").strip())
        return JsonResponse({"evaluations": [_evaluation_json(evaluation) for evaluation in page.rows],
                             "next": paging.next_link(request, sort="evaluations", after=page.next_after)})
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    body = _body(request, schemas.EvaluationCreate)
    # A version of another project is answered as a missing one: its id is not the caller's to learn of.
    version = (DatasetVersion.objects.select_related("dataset")
               .filter(dataset__project=project, public_id=body.dataset_version).first())
    if version is None:
        raise ValidationError({"dataset_version": f"{body.dataset_version!r} is not a dataset version of "
                                                  f"{project.slug} (dv_…)"})
    settings_sent = evaluation_services.EvaluationSettings(row_limit=body.row_limit,
                                                           max_new_tokens=body.max_new_tokens,
                                                           group_by=body.group_by.strip(),
                                                           answer_column=body.answer_column.strip(),
                                                           reward_terms=body.reward_terms)
    if body.run is not None:
        return _evaluate_every_checkpoint(request, project=project, run_id=body.run, version=version,
                                          settings=settings_sent)
    sent = request_send_once(request, create=lambda: evaluation_services.evaluation_create(
        project=project, model_ref=body.model, version=version, settings=settings_sent,
        user=request.user).public_id)
    return _created(_evaluation_json(evaluation_selectors.evaluation_get(project=project, public_id=sent.result)),
                    sent, status=202)


def _evaluate_every_checkpoint(request: HttpRequest, *, project: Project, run_id: str, version: DatasetVersion,
                               settings: evaluation_services.EvaluationSettings) -> JsonResponse:
    """POST evaluations/ with ``run``: ``services.evaluations_create_for_run``, its refusals keyed ``run``; 202 with
    the evaluations queued and the models skipped, left and not exported counted."""
    run = Run.objects.filter(project=project, public_id=run_id).first()
    if run is None:  # another project's is answered as a missing one, as a version is
        raise ValidationError({"run": f"{run_id!r} is not a run of {project.slug} (run_…)"})

    def create() -> str:
        done = evaluation_services.evaluations_create_for_run(project=project, run=run, version=version,
                                                              settings=settings, user=request.user)
        # Counts first, then the ids: at most MAX_RUN_EVALUATIONS of them, within a Submission's result.
        return " ".join(map(str, (len(done.skipped), len(done.left), len(done.not_exported),
                                  *(evaluation.public_id for evaluation in done.created))))

    with _fields_as_sent({"model": "run"}):
        sent = request_send_once(request, create=create)
    skipped, left, not_exported, *created = sent.result.split()
    queued = evaluation_selectors.evaluations_by_ids(project=project, public_ids=created)
    return _created({"run": run.public_id, "evaluations": [_evaluation_json(evaluation) for evaluation in queued],
                     "skipped": int(skipped), "left": int(left), "not_exported": int(not_exported)}, sent, status=202)


@api_view(("GET", "DELETE"))
def evaluation_detail(request: HttpRequest, slug: str, evaluation_id: str) -> HttpResponse:
    """GET: one evaluation, its result once it has succeeded. DELETE: delete one that has ended (an owner, or the
    member who launched it; 409 while it is queued or running: cancel it first)."""
    if request.method == "GET":
        project, _membership = get_project_for_user(request.user, slug)
        return JsonResponse(_evaluation_json(evaluation_selectors.evaluation_get(project=project,
                                                                                 public_id=evaluation_id)))
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    evaluation = evaluation_selectors.evaluation_get(project=project, public_id=evaluation_id)
    evaluation_selectors.ensure_may_delete_evaluation(membership=membership, evaluation=evaluation)
    try:
        evaluation_services.evaluation_delete(evaluation=evaluation, user=request.user)
    except ValidationError as error:
        return _error(409, detail="; ".join(error.messages))
    return HttpResponse(status=204)


@api_view(("POST",))
def evaluation_cancel(request: HttpRequest, slug: str, evaluation_id: str) -> JsonResponse:
    """Cancel a queued or running evaluation (members and owners; 409 once it has ended)."""
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    evaluation = evaluation_selectors.evaluation_get(project=project, public_id=evaluation_id)
    try:
        evaluation = evaluation_services.evaluation_cancel(evaluation=evaluation, user=request.user)
    except ValidationError as error:
        return _error(409, detail="; ".join(error.messages))
    return JsonResponse(_evaluation_json(evaluation_selectors.evaluation_get(project=project,
                                                                             public_id=evaluation.public_id)))
