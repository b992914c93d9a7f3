"""The OpenAPI 3.1 document of the REST API. Request bodies come from the pydantic schemas the
views validate with (``webapp.api.schemas``) and the job spec from ``jaxengine.spec.JobSpec``, so
the document cannot drift from what the server accepts."""
from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel

from jaxengine.spec import JobSpec
from webapp.activity import selectors as activity_selectors
from webapp.activity.models import TargetKind
from webapp.api import paging, schemas
from webapp.projects.models import DESCRIPTION_MAX_CHARS
from webapp.runs.pipelines import PipelineDocument
from webapp.runs.models import RunStatus
from webapp.runs.selectors import MAX_POINTS, METRIC_SORT, METRICS_MAX_POINTS, RUN_TASKS, SORTS

REF = "#/components/schemas/{model}"
SLUG = {"name": "slug", "in": "path", "required": True, "schema": {"type": "string"}, "description": "Project slug."}
RUN = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}, "description": "Run id (run_…)."}
EVALUATION = {"name": "evaluation_id", "in": "path", "required": True, "schema": {"type": "string"},
              "description": "Evaluation id (ev_…)."}
PIPELINE = {"name": "pipeline_id", "in": "path", "required": True, "schema": {"type": "string"},
            "description": "Pipeline id (pl_…)."}
DATASET = {"name": "dataset_id", "in": "path", "required": True, "schema": {"type": "string"},
           "description": "Dataset id (ds_…)."}
VERSION_NUMBER = {"name": "number", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 1},
                  "description": "Version number (1, 2, ...)."}
VERSION_ID = {"name": "version_id", "in": "path", "required": True, "schema": {"type": "string"},
              "description": "Dataset version id (dv_…), as a run's spec names it."}
CHAT_TOKEN = {"name": "token_id", "in": "path", "required": True, "schema": {"type": "integer"},
              "description": "A token's id, as chat-tokens/ lists it."}
CHECKPOINT_STEP = {"name": "step", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 0},
                   "description": "A checkpoint's step (the numbered folders under the run's checkpoints/)."}
BASE_MODEL = {"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"},
              "description": "Base model id (bm_…)."}
WEBHOOK = {"name": "webhook_id", "in": "path", "required": True, "schema": {"type": "string"},
           "description": "Webhook id (wh_…)."}
DELIVERY = {"name": "delivery_id", "in": "path", "required": True, "schema": {"type": "string"},
            "description": "Delivery id (whd_…), as deliveries/ lists it."}
IDEMPOTENCY_KEY = {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string"},
                   "description": "Sent again with the same key and body, the request is answered with what the first "
                                  "made (header Idempotent-Replayed: true) and nothing is queued again; sent again with "
                                  "another body, it is refused (422); sent again while the first is still being "
                                  "processed, it waits for the first (20 seconds at most, then 409: try again). At "
                                  "most 200 characters (a longer key: 400); kept for 7 days."}


def _json(description: str, model: type[BaseModel] | tuple[type[BaseModel], ...]) -> dict[str, Any]:
    """A JSON response whose body is ``model`` (or one of a tuple of them)."""
    models = model if isinstance(model, tuple) else (model,)
    references = [{"$ref": REF.format(model=one.__name__)} for one in models]
    return {"description": description, "content": {"application/json": {
        "schema": references[0] if len(references) == 1 else {"oneOf": references}}}}


def _refused_nothing_queued(why: str) -> dict[str, Any]:
    """The 409 of a POST that queues work under an Idempotency-Key: refused (``why``), or its first request still
    being processed."""
    return _json(f"Refused, nothing queued: `{{\"detail\": message}}` says why ({why}); or the first request sent "
                 "with this Idempotency-Key is still being processed: try again in a minute.", schemas.Detail)


ERRORS = {
    "400": _json("Bad input: `{\"errors\": {field: [messages]}}`.", schemas.FieldErrors),
    "401": _json("No valid bearer token: `{\"detail\": message}`.", schemas.Detail),
    "403": _json("Your role in the project does not allow this: `{\"detail\": message}`.", schemas.Detail),
    "404": _json("No such object in a project you belong to: `{\"detail\": message}`.", schemas.Detail),
    "405": {**_json("The address does not take this method: `{\"detail\": message}`.", schemas.Detail),
            "headers": {"Allow": {"description": "The methods the address takes, e.g. `GET, POST, HEAD`.",
                                  "schema": {"type": "string"}}}},
    "500": _json("The server failed (its log has the traceback): `{\"detail\": message}`.", schemas.Detail),
}
# Refused before the body is read (webapp.asgi): over TEMPER_MAX_UPLOAD_BYTES for a dataset upload,
# TEMPER_MODEL_UPLOAD_MAX_BYTES for a model archive, else DATA_UPLOAD_MAX_MEMORY_SIZE, each with 1 MB for framing.
TOO_LARGE = {"413": _json("The body is over the size this address takes: `{\"detail\": message}`.", schemas.Detail)}
NO_ROOM = {"507": _json("The server's disk has no room for the upload: its declared length is more than the free "
                        "space less a margin (refused before the body is written), or the disk filled as it was "
                        "written (nothing kept): `{\"detail\": message}` naming the free space.", schemas.Detail)}
KEY_REUSED = {"422": _json("The Idempotency-Key was sent before with another body: "
                           "`{\"errors\": {\"Idempotency-Key\": [message]}}`; nothing was made.", schemas.FieldErrors)}
IN_PROGRESS = {"409": _json("The first request sent with this Idempotency-Key is still being processed (a retry "
                            "sent while it works): `{\"detail\": message}`; nothing more was made: try again in a "
                            "minute to get what it made.", schemas.Detail)}
CHECKPOINT_REFUSED = {"409": _json("Refused, nothing deleted: `{\"detail\": message}` says why and what to do instead "
                                    "(the run is queued, running or stopping; the checkpoint is being exported, or a "
                                    "serving copy of it is being written).", schemas.Detail)}
# Every body the API answers with (webapp.api.schemas), the components the responses refer to.
ANSWERS = (schemas.ProjectList, schemas.ProjectOut, schemas.BaseModelList, schemas.BaseModelOut,
           schemas.DatasetList, schemas.DatasetDetail,
           schemas.DatasetComparison, schemas.DatasetVersionOut, schemas.UploadOut, schemas.RunPage, schemas.RunDetail, schemas.RunOut,
           schemas.SweepOut, schemas.MetricSeries, schemas.MetricsLogged, schemas.SampleList, schemas.SamplesStored, schemas.RunLog,
           schemas.PipelineList, schemas.PipelineOut, schemas.EvaluationList, schemas.EvaluationOut,
           schemas.RunEvaluationsOut,
           schemas.ChatTokenList, schemas.ChatTokenCreated,
           schemas.ProjectStorage, schemas.CheckpointsPruned, schemas.CheckpointList, schemas.CheckpointExportQueued,
           schemas.CheckpointServingCopyQueued, schemas.WebhookList, schemas.WebhookOut, schemas.DeliveryList,
           schemas.DeliveryOut, schemas.ProjectPruneState,
           schemas.FieldErrors, schemas.Detail)


# The views read no body as {}; these take {} (resume/ with no body trains a stopped run to its own total, retry/
# and checkpoints/<step>/export/ have no field, duplicate/ with none launches the run's spec as it is,
# checkpoints/prune/ with none pins nothing, checkpoints/<step>/serving-copy/ with none makes an int8 copy):
# every other body says what to make or change, and {} is refused.
OPTIONAL_BODIES = (schemas.RunResume, schemas.RunRetry, schemas.RunDuplicate, schemas.CheckpointsPrune,
                   schemas.CheckpointExport, schemas.CheckpointServingCopy, schemas.WebhookSecret,
                   schemas.WebhookTest, schemas.DeliveryRedeliver, schemas.StoragePruneRequest)


def _body(model: type[BaseModel]) -> dict[str, Any]:
    return {"required": model not in OPTIONAL_BODIES,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}


def _operation(summary: str, parameters: list, *, body: type[BaseModel] | None = None, status: str = "200",
               query: list | None = None, response: str = "JSON",
               answer: type[BaseModel] | tuple[type[BaseModel], ...] | None = None) -> dict[str, Any]:
    """``answer``: the body of the ``status`` response; a 204 has none."""
    answer = {"description": response} if answer is None else _json(response, answer)
    operation: dict[str, Any] = {"summary": summary, "parameters": parameters + (query or []),
                                 "responses": {status: answer, **ERRORS, **(TOO_LARGE if body is not None else {}),
                                               **(KEY_REUSED | IN_PROGRESS if IDEMPOTENCY_KEY in parameters else {})}}
    if body is not None:
        operation["requestBody"] = _body(body)
    return operation


def _with_409(operation: dict[str, Any], why: str) -> dict[str, Any]:
    operation["responses"]["409"] = _json(why, schemas.Detail)
    return operation


def _query(name: str, description: str, kind: str = "string") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": {"type": kind}, "description": description}


def _page_query(rows: str, *, default: int = paging.DEFAULT_LIMIT, maximum: int = paging.MAX_LIMIT
                ) -> list[dict[str, Any]]:
    """The ``limit`` and ``cursor`` parameters of a keyset-paged list of ``rows`` (``webapp.api.paging``)."""
    return [{**_query("limit", f"{rows} per page (default {default})"),
             "schema": {"type": "integer", "minimum": 1, "maximum": maximum}},
            _query("cursor", "where the page starts: as given in the previous page's next link")]


def _enum(name: str, description: str, values) -> dict[str, Any]:
    return {**_query(name, description), "schema": {"type": "string", "enum": list(values)}}


def _sort_query() -> dict[str, Any]:
    """The runs list's ``sort``: a named order, or a final metric's as the Runs page sorts by it."""
    return {**_query("sort", f"order; default newest; or by a final metric, {METRIC_SORT}<final metric> lowest first "
                             f"and -{METRIC_SORT}<final metric> highest first (runs without it last either way)"),
            "schema": {"anyOf": [{"type": "string", "enum": list(SORTS)},
                                 {"type": "string", "pattern": f"^-?{METRIC_SORT}.+$"}]}}


@cache
def build_document() -> dict[str, Any]:
    components: dict[str, Any] = {}
    for model in (schemas.RunCreate, schemas.RunResume, schemas.RunRetry, schemas.RunDuplicate, schemas.CheckpointsPrune,
                  schemas.CheckpointExport, schemas.CheckpointServingCopy,
                  schemas.MetricsLog, schemas.SamplesLog, schemas.RunFinish,
                  schemas.ChatTokenCreate, schemas.EvaluationCreate, schemas.ProjectUpdate, schemas.WebhookCreate, schemas.WebhookUpdate, schemas.WebhookSecret,
                  schemas.WebhookTest, schemas.DeliveryRedeliver, schemas.StoragePruneRequest,
                  JobSpec, PipelineDocument, *ANSWERS):
        schema = model.model_json_schema(ref_template=REF)
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    checkpoint_delete = _operation(
        "Delete a training checkpoint of a run that has ended, to free its disk; the run, its curves, its other "
        "checkpoints and the checkpoint's export stay (an owner, or the member who launched the run; 404 for a step "
        "the run's folder holds no checkpoint of)", [SLUG, RUN, CHECKPOINT_STEP], status="204",
        response="Nothing: deleted")
    checkpoint_delete["responses"].update(CHECKPOINT_REFUSED)
    checkpoints_prune = _operation(
        "Delete every training checkpoint of a run that has ended but the newest (what Resume / Train further "
        "restores), the best by the run's ranking metric and the steps of keep, each as DELETE checkpoints/<step>/ "
        "does; exports stay. The answer lists what was deleted and kept, with why; 400 naming a pinned step the "
        "folder holds no checkpoint of (an owner, or the member who launched the run)", [SLUG, RUN],
        body=schemas.CheckpointsPrune, answer=schemas.CheckpointsPruned)
    checkpoints_prune["responses"].update(CHECKPOINT_REFUSED)
    checkpoint_export = _operation(
        "Export a checkpoint as a starting model, as the run page's Export as a starting model under Checkpoints (a "
        "member or owner): the train queue writes it, and runs then name run_…@<step> as their model (GET "
        "checkpoints/ shows the export's status); a failed export may be asked for again. 404 for a step the run has "
        "neither a checkpoint nor an export of", [SLUG, RUN, CHECKPOINT_STEP, IDEMPOTENCY_KEY], body=schemas.CheckpointExport,
        status="202", response="the export queued", answer=schemas.CheckpointExportQueued)
    checkpoint_export["responses"]["409"] = _refused_nothing_queued(
        "the run has not finished, or is external; the checkpoint is exported already (its training checkpoint "
        "deleted since or not), being exported, or the run's final model, started from as run_…")
    checkpoint_serving_copy = _operation(
        "Make the quantized serving copy of an exported checkpoint, which the chat and /v1/ then serve for "
        "run_…@<step>, as the run page's button beside it (a member or owner): a serve worker writes it, GET "
        "checkpoints/ shows its state; asked again while it is written, nothing more is queued (queued: false); a "
        "ready or failed one is made again, the old copy serving until the new one is whole. 404 for a step the run "
        "has no checkpoint of", [SLUG, RUN, CHECKPOINT_STEP, IDEMPOTENCY_KEY], body=schemas.CheckpointServingCopy,
        status="202", response="the copy's state", answer=schemas.CheckpointServingCopyQueued)
    checkpoint_serving_copy["responses"]["409"] = _refused_nothing_queued(
        "the checkpoint is not exported yet: POST checkpoints/<step>/export/ first; a reward model, which writes no "
        "text; its export's folder gone")
    upload = {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file"], "additionalProperties": False,
        "properties": {"file": {"type": "string", "format": "binary"},
                       "name": {"type": "string", "description": "A new dataset's name (sent with dataset, it must be that "
                                                                "dataset's name)."},
                       "kind": {"type": "string", "enum": ["text", "sft", "preference", "prompts"]},
                       "dataset": {"type": "string", "description": "Or an existing dataset's id: a new version."},
                       "file_format": {"type": "string", "enum": ["jsonl", "json", "csv", "parquet"]},
                       "mapping": {"type": "string", "description": "JSON object: field → column name. Left out of a "
                                                                   "new version, the last version's is kept (the "
                                                                   "answer's mapping_inherited_from); {} for none."}}}}}}
    upload_operation = _operation("Upload a dataset (or a new version of one)", [SLUG, IDEMPOTENCY_KEY],
                                  status="201", answer=schemas.UploadOut)
    upload_operation["responses"].update(TOO_LARGE | NO_ROOM)  # its body is the multipart form below, not a schema's
    model_upload = {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["name", "archive"], "additionalProperties": False,
        "properties": {"name": {"type": "string", "maxLength": 100,
                                "description": "The model's name here, and its folder's under the project's own "
                                               "(projects/<slug>/<name>/): letters, digits, '.', '_' and '-', starting "
                                               "with a letter or digit."},
                       "archive": {"type": "string", "format": "binary",
                                   "description": "A .zip, .tar or .tar.gz (.tgz) of a Hugging Face-format model "
                                                  "directory (config.json, *.safetensors, tokenizer files), its files "
                                                  "at the top or in one folder there; at most "
                                                  "TEMPER_MODEL_UPLOAD_MAX_BYTES unpacked and "
                                                  "TEMPER_MODEL_UPLOAD_MAX_MEMBERS files and folders."}}}}}}
    model_upload_operation = _operation(
        "Upload a model archive (an owner): unpacked into the project's own folder, checked as a registration is, "
        "and registered (400 naming the field, or the archive's member, and what to do; nothing is kept)",
        [SLUG, IDEMPOTENCY_KEY], status="201", response="the registered base model", answer=schemas.BaseModelOut)
    model_upload_operation["responses"].update(TOO_LARGE | NO_ROOM)
    storage_prune = _operation(
        "Prune the checkpoints of every run of the project that has ended, as the Storage page's Prune checkpoints of "
        "ended runs… (owners): each keeps its newest (what Resume restores) and its best; active runs are skipped. A "
        "worker of the default queue does it: GET storage/prune/ follows it", [SLUG, IDEMPOTENCY_KEY],
        body=schemas.StoragePruneRequest, status="202", response="the prune, queued",
        answer=schemas.ProjectPruneState)
    storage_prune["responses"]["409"] = _refused_nothing_queued(
        "another prune of the project is queued or running: wait for it to finish (GET storage/prune/ follows it)")
    webhook_refused = ("400 naming the field: an address that is not http(s), or at a non-public address (a "
                       "loopback, private or link-local one) where TEMPER_WEBHOOK_ALLOWED_NETWORKS does not list its "
                       "network; no event or an unknown one; a format other than json and slack")
    owners = " (owners only: members and viewers get 403, a hook's address and secret being secrets)"
    sent_now = ("the delivery as sent: delivered (a 2xx answer), pending (a worker retries it at next_attempt_at), or "
                "failed (its address refused), with the answer's status, error and first characters")
    base = "/api/v1/projects/{slug}"
    paths = {
        f"{base}/webhooks/": {
            "get": _operation("The project's webhooks, as its Webhooks page lists them, each with its signing secret"
                              + owners, [SLUG], answer=schemas.WebhookList),
            "post": _operation("Add a webhook, as the Webhooks page does; its answer holds the hook's secret, which "
                               "receivers check signatures with: keep it secret" + owners + "; " + webhook_refused,
                               [SLUG, IDEMPOTENCY_KEY], body=schemas.WebhookCreate, status="201",
                               response="the webhook, with its secret", answer=schemas.WebhookOut),
        },
        f"{base}/webhooks/{{webhook_id}}/": {
            "get": _operation("A webhook, with its secret" + owners, [SLUG, WEBHOOK], answer=schemas.WebhookOut),
            "patch": _operation("Change a webhook's address, events, format or whether it is on (any of them; all or "
                                "nothing), as the page's Edit" + owners + "; " + webhook_refused, [SLUG, WEBHOOK],
                                body=schemas.WebhookUpdate, answer=schemas.WebhookOut),
            "delete": _operation("Delete a webhook and its deliveries" + owners, [SLUG, WEBHOOK], status="204",
                                 response="Nothing: deleted"),
        },
        f"{base}/webhooks/{{webhook_id}}/secret/": {"post": _operation(
            "Replace a webhook's secret, as the page's New secret…: messages from now on (retries too) are signed "
            "with the new one, which the answer holds" + owners, [SLUG, WEBHOOK], body=schemas.WebhookSecret,
            response="the webhook, with its new secret", answer=schemas.WebhookOut)},
        f"{base}/webhooks/{{webhook_id}}/test/": {"post": _operation(
            "Send test, as the page's: a ping POSTed to the hook now (also while it is turned off)" + owners,
            [SLUG, WEBHOOK], body=schemas.WebhookTest, status="201", response=sent_now, answer=schemas.DeliveryOut)},
        f"{base}/webhooks/{{webhook_id}}/deliveries/": {"get": _operation(
            "A webhook's deliveries, newest first (it keeps its newest 200)" + owners, [SLUG, WEBHOOK],
            query=_page_query("deliveries"), response="`{\"deliveries\": [...], \"next\": url}`: follow `next` "
                                                     "(null on the last page) for older ones",
            answer=schemas.DeliveryList)},
        f"{base}/webhooks/{{webhook_id}}/deliveries/{{delivery_id}}/redeliver/": {"post": _operation(
            "Redeliver, as the page's: the delivery's recorded payload POSTed now as a new delivery, to the hook's "
            "current address, in its format, signed with its secret" + owners, [SLUG, WEBHOOK, DELIVERY],
            body=schemas.DeliveryRedeliver, status="201", response=sent_now, answer=schemas.DeliveryOut)},
        f"{base}/storage/prune/": {
            "get": _operation("The project's newest project-wide checkpoint prune, queued, under way or its outcome, "
                              "as the Storage page shows it (every member, viewers too)", [SLUG],
                              answer=schemas.ProjectPruneState),
            "post": storage_prune,
        },
        f"{base}/runs/{{run_id}}/artifacts/{{kind}}/card/": {
            "get": {**_operation("The model card (README.md) the engine wrote into an artifact (model, adapter, or "
                                 "checkpoint with ?step=N: the card_url of each of the run's artifacts), as Markdown, "
                                 "as the run page's Model card shows it; 404 saying why for an artifact the run has "
                                 "not, an export written before exports had cards (export it again), or a card over "
                                 "1 MiB (read it in the downloaded folder)",
                                 [SLUG, RUN, {"name": "kind", "in": "path", "required": True,
                                              "schema": {"type": "string", "enum": ["model", "adapter", "checkpoint"]}},
                                  _query("step", "checkpoint: its step", "integer")]),
                    "responses": {"200": {"description": "the card: YAML front matter, then Markdown",
                                          "content": {"text/markdown": {"schema": {"type": "string"}}}},
                                  **ERRORS}},
        },
        "/api/v1/projects/": {"get": _operation(
            "List the projects the token's user belongs to, by name: their slugs (which every other address names), "
            "your role in each, and the addresses of their lists", [], answer=schemas.ProjectList)},
        f"{base}/": {
            "get": _operation("The project as GET /api/v1/projects/ lists it: its name, description, your role and "
                              "the addresses of its lists (every member, viewers too)", [SLUG],
                              answer=schemas.ProjectOut),
            "patch": _operation("Rename the project or set its description (either; all or nothing), as its Settings "
                                "page does (owners only: members and viewers get 403); the slug never changes. 400 "
                                "naming the field: a blank name, one over 100 characters or holding an invisible "
                                f"character, a description over {DESCRIPTION_MAX_CHARS:,} characters", [SLUG],
                                body=schemas.ProjectUpdate, answer=schemas.ProjectOut),
        },
        f"{base}/base-models/": {"get": _operation("List the project's base models (the bm_… ids a run's model names), "
                                                   "each with the licence its exports carry, as its detail answers",
                                                   [SLUG], answer=schemas.BaseModelList),
                                 "post": {**model_upload_operation, "requestBody": model_upload}},
        f"{base}/base-models/{{model_id}}/": {
            "get": _operation("A base model: architecture, size, tokenizer, and the licence its exports carry",
                              [SLUG, BASE_MODEL], answer=schemas.BaseModelOut),
            "delete": _operation("Unregister a base model and remove its serving copies; its directory stays unless "
                                 "delete_files is true (an owner, or the member who registered it; 400 while runs, a "
                                 "pipeline, its serving copy or a review campaign still need it, cancelled or failed "
                                 "runs from it that may still be resumed or retried among them)", [SLUG, BASE_MODEL],
                                 status="204", response="Nothing: unregistered (and its folder deleted, if asked)",
                                 query=[{**_query("delete_files", (
                                     "true: also delete the model's folder, freeing its disk space and its name for a "
                                     "new upload: an owner only (403 otherwise), for a model Temper unpacked itself "
                                     "(uploaded: true). Refused, nothing deleted, with a 400 on delete_files saying why, "
                                     "for a registered directory or a folder no longer where the upload put it (a link "
                                     "or a mount in its place, moved); a link inside the folder is removed, never "
                                     "followed. A 500 says the model was unregistered but its folder could not be "
                                     "deleted. Default false."), "boolean")}]),
        },
        f"{base}/datasets/": {
            "get": _operation("List the project's datasets, by name", [SLUG],
                              query=_page_query("datasets"),
                              response="`{\"datasets\": [...], \"next\": url}`: follow `next` (null on the "
                                       "last page) for the page after", answer=schemas.DatasetList),
            "post": {**upload_operation, "requestBody": upload},
        },
        f"{base}/datasets/{{dataset_id}}/": {
            "get": _operation("A dataset and its versions", [SLUG, DATASET], answer=schemas.DatasetDetail),
            "patch": _operation("Set where a dataset's rows came from, their licence and a description (any of them; "
                                "all or nothing; members): runs launched on it since carry them into their model "
                                "cards", [SLUG, DATASET], body=schemas.DatasetUpdate, answer=schemas.DatasetDetail),
            "delete": _operation("Delete a dataset, every version and their files (an owner, or the member who made "
                                 "it and uploaded each version; 400 while work still reads one)", [SLUG, DATASET],
                                 status="204", response="Nothing: deleted"),
        },
        f"{base}/datasets/{{dataset_id}}/compare/": {
            "get": _operation(
                "Compare two ready versions of a dataset: the rows unchanged, removed from a and added in b, compared "
                "as training reads them (after each version's column mapping), duplicates counted as often as they "
                "occur (a row twice in a and once in b: one removed). 404 for a version number the dataset has not "
                "got; 400 naming a or b for a value that is not a number, a version not ready, or the same version "
                "twice", [SLUG, DATASET],
                query=[{**_query("a", "version A's number (default: the latest ready version before b)"),
                        "schema": {"type": "integer", "minimum": 1}},
                       {**_query("b", "version B's number (default: the latest ready version)"),
                        "schema": {"type": "integer", "minimum": 1}},
                       *_page_query("row numbers of each list", default=paging.ROWS_DEFAULT_LIMIT,
                                    maximum=paging.ROWS_MAX_LIMIT)],
                response="the counts, and a page of the removed rows' numbers in a and the added rows' in b: follow "
                         "`next` (null on the last page) for the page after", answer=schemas.DatasetComparison),
        },
        f"{base}/datasets/{{dataset_id}}/versions/{{number}}/": {
            "get": _operation("A dataset version", [SLUG, DATASET, VERSION_NUMBER], answer=schemas.DatasetVersionOut),
            "delete": _operation("Delete a dataset version and its file (an owner, or the member who uploaded it; its "
                                 "number is not given again; 400 while work still reads it)",
                                 [SLUG, DATASET, VERSION_NUMBER], status="204", response="Nothing: deleted"),
        },
        f"{base}/datasets/{{dataset_id}}/versions/{{number}}/split/": {
            "post": _operation("Split a ready version into a new training dataset and a new held-out dataset (members): "
                               "the held-out rows drawn with the seed, each value of the stratify column holding out "
                               "its share, exact duplicates on one side so that the two share no row. A worker writes "
                               "the files and checks them as uploads: poll the two versions until ready or failed. "
                               "400 naming each field refused (held_out, seed, stratify, train_name, held_out_name, "
                               "or version for one not ready), nothing saved",
                               [SLUG, DATASET, VERSION_NUMBER, IDEMPOTENCY_KEY], body=schemas.DatasetVersionSplit,
                               status="202", response="the two new versions, queued",
                               answer=schemas.DatasetVersionSplitOut),
        },
        f"{base}/datasets/{{dataset_id}}/versions/{{number}}/derive/": {
            "post": _operation("Write a new version of the dataset from a ready version (members): kind dedupe keeps "
                               "the first of each exact repeat, kind decontaminate removes every row that version "
                               "`against` (a ready version of the project, of the same kind) also holds; rows are "
                               "compared as training reads them. A worker writes the file and checks it as an upload: "
                               "poll the version until ready or failed. 400 naming the field refused (kind, against, "
                               "or version for one not ready or with no exact repeats), nothing saved",
                               [SLUG, DATASET, VERSION_NUMBER, IDEMPOTENCY_KEY], body=schemas.DatasetVersionDerive,
                               status="202", response="the new version, queued", answer=schemas.DatasetVersionOut),
        },
        f"{base}/datasets/{{dataset_id}}/versions/{{number}}/file/": {
            "get": {**_operation("Download a ready version's file, byte for byte as it was uploaded (404 before it is "
                                 "ready, and for a failed one, which keeps no file)", [SLUG, DATASET, VERSION_NUMBER]),
                    "responses": {"200": {"description": "the file, as an attachment under its original name",
                                          "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                              "format": "binary"}}}},
                                  **ERRORS}},
        },
        f"{base}/dataset-versions/{{version_id}}/": {
            "get": _operation("A dataset version by its dv_… id, the one a run's spec names (the same answer as "
                              "datasets/{dataset_id}/versions/{number}/; 404 for another project's)",
                              [SLUG, VERSION_ID], answer=schemas.DatasetVersionOut),
        },
        f"{base}/runs/": {
            "get": _operation("List runs", [SLUG], query=[_query("q", "a part of the name, id, a tag or the notes (case aside)"),
                                                          _enum("status", "status (another value: 400)",
                                                                RunStatus.values),
                                                          _enum("task", "task (another value: 400)", RUN_TASKS),
                                                          _query("tag", "a whole tag (case aside)"),
                                                          _enum("archived", "1: archived runs only; 0 (default): "
                                                                            "the others", ["0", "1"]),
                                                          _sort_query(),
                                                          *_page_query("runs")],
                              response="`{\"runs\": [...], \"next\": url}`: follow `next` (null on the last "
                                       "page) for the page after; it keeps the query", answer=schemas.RunPage),
            "post": _operation("Launch a run from a job spec (or, with sweep, a run per combination of values), "
                               "or open an external run", [SLUG, IDEMPOTENCY_KEY], body=schemas.RunCreate,
                               status="201", response="the run; for a sweep `{\"sweep\": tag, \"runs\": [...]}`, "
                                                      "in the order they were queued",
                               answer=(schemas.RunDetail, schemas.SweepOut)),
        },
        f"{base}/runs/{{run_id}}/": {
            "get": _operation("A run: status, progress, spec, final metrics", [SLUG, RUN], answer=schemas.RunDetail),
            "patch": _operation("Rename, tag, write notes on, archive or restore a run (any of them; all or nothing; "
                                "archiving a queued or running run is refused)", [SLUG, RUN],
                                body=schemas.RunUpdate, answer=schemas.RunDetail),
            "delete": _operation("Delete a finished run and its files (an owner, or the member who launched it; 400 "
                                 "while it or work on its model still runs)", [SLUG, RUN], status="204",
                                 response="Nothing: deleted"),
        },
        f"{base}/runs/{{run_id}}/cancel/": {"post": _operation(
            "Cancel a queued run (at once) or a running one (after its current step: `stopping` is true until it "
            "has stopped)", [SLUG, RUN], answer=schemas.RunOut)},
        f"{base}/runs/{{run_id}}/resume/": {"post": _operation(
            "Resume a finished run from its last checkpoint (a 400 says why not: among others, its run folder with "
            "the checkpoints it saved was deleted since; duplicate/ it as a new run then)",
            [SLUG, RUN], body=schemas.RunResume, answer=schemas.RunOut)},
        f"{base}/runs/{{run_id}}/retry/": {"post": _operation(
            "Retry a run, as its page's Retry: its spec started over as a new run named '<name> (retry)', with its "
            "tags (a member or owner; a 400 says why not: an external run, or what it trains on deleted since, "
            "when the 400 names the duplicate/ to send instead)", [SLUG, RUN, IDEMPOTENCY_KEY],
            body=schemas.RunRetry, status="201", response="the new run", answer=schemas.RunDetail)},
        f"{base}/runs/{{run_id}}/duplicate/": {"post": _operation(
            "Duplicate a run and launch the copy: its spec as its page's Duplicate fills the launch form with, the "
            "body's spec merged onto it, launched and checked as POST runs/ launches a spec (a 400 names the spec "
            "key, e.g. data.train for a dataset version deleted since); the page's Duplicate only fills the form",
            [SLUG, RUN, IDEMPOTENCY_KEY], body=schemas.RunDuplicate, status="201", response="the new run",
            answer=schemas.RunDetail)},
        f"{base}/runs/{{run_id}}/finish/": {"post": _operation("Close an external run", [SLUG, RUN],
                                                               body=schemas.RunFinish, answer=schemas.RunOut)},
        f"{base}/runs/{{run_id}}/metrics/": {
            "get": _operation("Metric series (downsampled beyond max_points), with the names asked for that the "
                              "run has logged no point of (unknown_names) and those it has (metric_names)",
                              [SLUG, RUN],
                              query=[_query("names", "comma-separated metric names (default: every one)"),
                                     _query("after_step", "only points after this step", "integer"),
                                     {**_query("max_points", f"points per metric before downsampling (default "
                                                            f"{MAX_POINTS})"),
                                      "schema": {"type": "integer", "minimum": 2, "maximum": METRICS_MAX_POINTS}}],
                              answer=schemas.MetricSeries),
            "post": _operation("Log metric points into an external run", [SLUG, RUN], body=schemas.MetricsLog,
                               status="201", answer=schemas.MetricsLogged),
        },
        f"{base}/runs/{{run_id}}/samples/": {
            "get": _operation("Logged generations", [SLUG, RUN],
                              query=[_query("step", "one step (not a whole number: 400)", "integer"),
                                     *_page_query("samples", default=paging.SAMPLES_DEFAULT_LIMIT,
                                                  maximum=paging.SAMPLES_MAX_LIMIT)],
                              response="`{\"samples\": [...], \"next\": url}`: by step, then position; follow "
                                       "`next` (null on the last page) for the page after",
                              answer=schemas.SampleList),
            "post": _operation("Log generations into an external run", [SLUG, RUN], body=schemas.SamplesLog,
                               status="201", answer=schemas.SamplesStored),
        },
        f"{base}/runs/{{run_id}}/logs/": {
            "get": _operation("The run's log (the run page's Log), oldest first: the first lines after a line, or "
                              "the last lines", [SLUG, RUN],
                              query=[{**_query("after", "the id of the last line you have: only lines after it "
                                                        "(default 0: from the first)"),
                                      "schema": {"type": "integer", "minimum": 0}},
                                     {**_query("limit", f"the first lines after after (default "
                                                        f"{paging.LOG_DEFAULT_LIMIT})"),
                                      "schema": {"type": "integer", "minimum": 1, "maximum": paging.LOG_MAX_LIMIT}},
                                     {**_query("tail", "instead of limit: the last lines (after after), as the run "
                                                       "page opens on"),
                                      "schema": {"type": "integer", "minimum": 1, "maximum": paging.LOG_MAX_LIMIT}}],
                              response="`{\"lines\": [...], \"next\": url}`: follow `next` for the lines after "
                                       "these (an empty page while the run still runs: wait, and follow it again); "
                                       "null once the run has ended and its log is read to the end",
                              answer=schemas.RunLog),
        },
        f"{base}/storage/": {
            "get": _operation("What the project's files take on disk now, as du counts it, in bytes: the Storage "
                              "page's figures; its runs, datasets and base models each largest first (every member, "
                              "viewers too)", [SLUG], answer=schemas.ProjectStorage),
        },
        f"{base}/activity/": {
            "get": _operation("The project's activity log, newest first: who launched, cancelled, deleted or changed "
                              "what (people's actions only; every member, viewers too)", [SLUG],
                              query=[*_page_query("entries"),
                                     _query("actor", "only this username's entries"),
                                     _enum("action", "only entries of this thing done, in the log's words (with "
                                                     "`kind=run`, `deleted` lists the runs deleted)",
                                           activity_selectors.ACTIONS),
                                     _enum("kind", "only entries about this kind of object", TargetKind.values)],
                              response="`{\"activity\": [...], \"next\": url}`: follow `next` (null on the "
                                       "last page) for older entries", answer=schemas.ActivityList),
        },
        f"{base}/pipelines/": {
            "get": _operation("List pipelines, newest first", [SLUG],
                              query=_page_query("pipelines"),
                              response="`{\"pipelines\": [...], \"next\": url}`: follow `next` (null on the "
                                       "last page) for the page after", answer=schemas.PipelineList),
            "post": _operation("Start a pipeline (every stage is validated first)", [SLUG, IDEMPOTENCY_KEY],
                               body=PipelineDocument, status="201", answer=schemas.PipelineOut),
        },
        f"{base}/pipelines/{{pipeline_id}}/": {
            "get": _operation("A pipeline: status, stages and their runs, result, reason it stopped",
                              [SLUG, PIPELINE],
                              answer=schemas.PipelineOut),
        },
        f"{base}/pipelines/{{pipeline_id}}/cancel/": {"post": _operation(
            "Cancel a running pipeline: its current stage's run is cancelled (a queued one at once, a training one "
            "after its current step), an export stage not yet writing is dropped (400 while it writes its serving "
            "copy, and once the pipeline has ended)", [SLUG, PIPELINE], answer=schemas.PipelineOut)},
        f"{base}/evaluations/": {
            "get": _operation("List evaluations, newest first (every member, viewers too)", [SLUG],
                              query=[_query("model", "only this model's: a base model's id (bm_…) or a run's "
                                                     "(run_…), a run's covering its exported checkpoints"),
                                     *_page_query("evaluations")],
                              response="`{\"evaluations\": [...], \"next\": url}`: follow `next` (null on the "
                                       "last page) for the page after", answer=schemas.EvaluationList),
            "post": _operation("Evaluate a model on a ready dataset version (members and owners), or with run "
                               "every exported checkpoint and the final model of a run: everything is "
                               "checked first (400 naming the field: the model or run, the version's kind and rows, "
                               "the group-by column's values, a reward term as reward_terms.<n>.<key>), then the "
                               "serve worker scores it", [SLUG, IDEMPOTENCY_KEY],
                               body=schemas.EvaluationCreate, status="202",
                               response="the evaluation, queued; with run `{\"run\", \"evaluations\": [...], "
                                        "\"skipped\", \"left\", \"not_exported\"}`",
                               answer=(schemas.EvaluationOut, schemas.RunEvaluationsOut)),
        },
        f"{base}/evaluations/{{evaluation_id}}/": {
            "get": _operation("An evaluation: status, settings, and its result once it has succeeded",
                              [SLUG, EVALUATION], answer=schemas.EvaluationOut),
            "delete": _with_409(_operation("Delete an evaluation that has ended (an owner, or the member who launched it)",
                                           [SLUG, EVALUATION], status="204", response="Nothing: deleted"),
                                "Refused, nothing deleted: `{\"detail\": message}`: it is queued or running; cancel "
                                "it first"),
        },
        f"{base}/evaluations/{{evaluation_id}}/cancel/": {"post": _with_409(_operation(
            "Cancel a queued or running evaluation (members and owners)", [SLUG, EVALUATION],
            answer=schemas.EvaluationOut), "Refused: `{\"detail\": message}`: it has ended already")},
        f"{base}/chat-tokens/": {
            "get": _operation("Your own tokens of the OpenAI-compatible API (/v1/) for the project, newest first, "
                              "without their secrets (members and owners, as on the Chat page)", [SLUG],
                              answer=schemas.ChatTokenList),
            "post": _operation("Make a token of the OpenAI-compatible API (/v1/) for the project, as the Chat page's "
                               "'API tokens for this project' does (members and owners): its secret is in this "
                               "answer only", [SLUG, IDEMPOTENCY_KEY], body=schemas.ChatTokenCreate, status="201",
                               response="the token, with its secret", answer=schemas.ChatTokenCreated),
        },
        f"{base}/chat-tokens/{{token_id}}/": {
            "delete": _operation("Revoke one of your tokens for the project: /v1/ refuses it from then on (404 for "
                                 "an id that is not one of yours here, revoked already or someone else's)",
                                 [SLUG, CHAT_TOKEN], status="204", response="Nothing: revoked"),
        },
        f"{base}/runs/{{run_id}}/checkpoints/": {
            "get": _operation("The run's checkpoints as its page's Checkpoints lists them, oldest first (every member, "
                              "viewers too): each training checkpoint's disk and when it was saved, its export and "
                              "the model a run names to start from it, its score, its serving copy and, for who may "
                              "delete the run once it has ended, whether DELETE checkpoints/<step>/ is refused or "
                              "what it changes", [SLUG, RUN], answer=schemas.CheckpointList),
        },
        f"{base}/runs/{{run_id}}/checkpoints/{{step}}/": {
            "delete": checkpoint_delete,
        },
        f"{base}/runs/{{run_id}}/checkpoints/{{step}}/export/": {"post": checkpoint_export},
        f"{base}/runs/{{run_id}}/checkpoints/{{step}}/serving-copy/": {"post": checkpoint_serving_copy},
        f"{base}/runs/{{run_id}}/checkpoints/prune/": {"post": checkpoints_prune},
        f"{base}/runs/{{run_id}}/artifacts/{{kind}}/": {
            "get": {**_operation("Download an artifact (model, adapter, or checkpoint with ?step=N: the url each of "
                                 "the run's artifacts gives) as a tar archive; 404 saying why for one the run has not",
                                 [SLUG, RUN, {"name": "kind", "in": "path", "required": True,
                                              "schema": {"type": "string", "enum": ["model", "adapter", "checkpoint"]}},
                                  _query("step", "checkpoint: its step", "integer")]),
                    "responses": {"200": {"description": "tar archive",
                                          "content": {"application/x-tar": {"schema": {"type": "string",
                                                                                       "format": "binary"}}}},
                                  **ERRORS}},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Temper API", "version": "1",
                 "description": "Datasets, runs, metrics, samples and artifacts of Temper projects. "
                                "Authenticate with `Authorization: Bearer <token>` (a tmp_… token: the API tokens "
                                "page, or `python manage.py resttoken --user NAME`); `GET /api/v1/projects/` lists "
                                "the projects it reaches, whose slugs the other addresses name."},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }
