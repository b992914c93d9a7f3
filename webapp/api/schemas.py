"""Request bodies of the REST API, validated by pydantic; errors name the field."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, ValidationInfo, field_validator, model_validator

from webapp.chat.tokens import DEFAULT_TOKEN_NAME, TOKEN_NAME_MAX
from webapp.core.auth_header import DEFAULT_TOKEN_LIFETIME, TOKEN_LIFETIMES
from webapp.core.numbers import MAX_STORED_INT
from webapp.projects.models import DESCRIPTION_MAX_CHARS
from webapp.runs.models import SERVING_COPY_SCHEMES
from webapp.runs.services import RUN_NAME_MAX
from webapp.webhooks.models import EVENTS, DeliveryStatus, WebhookFormat

# Steps are stored as PositiveIntegerFields, token counts as 64-bit integers: past these an INSERT failed
# (OverflowError, a 500) instead of naming the field.
MAX_TOKENS = 2**62


class _Body(BaseModel):
    # strict: "64" is not 64, nor 1 true; a script that sends text for a number is told, not guessed at.
    model_config = ConfigDict(extra="forbid", strict=True)


class RunCreate(_Body):
    """Launch a run from a job spec (ids in place of paths, as in the web's YAML view), or open an
    external run (``external: true``) that a process elsewhere logs into."""

    spec: dict[str, Any] | None = Field(default=None, description="The job spec as a mapping.")
    spec_yaml: str | None = Field(default=None, description="Or the job spec as YAML text.")
    name: str = Field(default="", description=f"At most {RUN_NAME_MAX} characters (a longer name is refused, "
                                              "not cut); blank: one made from the spec, or 'external run'.")
    tags: list[str] = Field(default_factory=list)
    sweep: dict[str, list[Any]] | None = Field(
        default=None, description="A run for every combination of these spec keys' values, e.g. "
                                  '{"optim.learning_rate": [0.0001, 0.0003], "peft.rank": [8, 16]} (4 runs): each '
                                  "the spec with those keys set, named after its values and tagged sweep-<id>; all "
                                  "are checked before any is made, at most TEMPER_SWEEP_MAX_RUNS (default 16) of them. The "
                                  'answer is {"sweep": tag, "runs": [...]}, in the order they were queued.')
    external: bool = Field(default=False, description="Open a run trained elsewhere; give config, not spec.")
    config: dict[str, Any] | None = Field(default=None, description="External runs: their hyper-parameters.")

    @model_validator(mode="after")
    def _one_source(self) -> RunCreate:
        if self.external:
            if self.spec is not None or self.spec_yaml is not None or self.sweep is not None:
                raise ValueError("an external run takes config, not spec, spec_yaml or sweep")
        elif (self.spec is None) == (self.spec_yaml is None):
            raise ValueError("give exactly one of spec and spec_yaml (or external: true)")
        return self


class RunUpdate(_Body):
    """What the run page's edit form and archive button change; a key left out is left as it is."""

    name: str | None = Field(default=None, description=f"At most {RUN_NAME_MAX} characters, not blank.")
    tags: list[str] | None = Field(default=None, description="Replace the tags (an empty list: none). Tags differing "
                                   "only in letter case are one tag of the project: one given again takes the "
                                   "spelling the project's runs give it.")
    notes: str | None = Field(default=None, description="Markdown notes (\"\": none).")
    archived: bool | None = Field(default=None, description="Hide the run from the default table (a queued or "
                                                            "running run is refused: cancel it first) or restore it.")

    @field_validator("name", "tags", "notes", "archived")
    @classmethod
    def _not_null(cls, value: Any, info: ValidationInfo) -> Any:
        # Only a value sent is checked (defaults are not): a null sent would otherwise read as left out.
        if value is None:
            clear = ', or send "" to clear it' if info.field_name == "notes" else ""
            raise ValueError(f"null is not a value of {info.field_name}: leave the key out to keep it as it is{clear}")
        return value

    @model_validator(mode="after")
    def _something_given(self) -> RunUpdate:
        if not self.model_fields_set:
            raise ValueError("give at least one of name, tags, notes, archived")
        return self


class DatasetUpdate(_Body):
    """What the dataset page's "About this dataset" changes; a key left out is left as it is, "" clears it."""

    source: str | None = Field(default=None, description="Where the rows came from: an address (https://…), a "
                               "Hugging Face hub id (org/name; a model card's front matter lists it under datasets) "
                               "or words. One line, at most 500 characters.")
    licence: str | None = Field(default=None, description="The terms the rows are under, e.g. cc-by-4.0. One line, "
                                                          "at most 100 characters.")
    description: str | None = Field(default=None, description="The dataset in words, at most 2000 characters.")

    @field_validator("source", "licence", "description")
    @classmethod
    def _not_null(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:  # only a value sent is checked: a null sent would otherwise read as left out
            raise ValueError(f'null is not a value of {info.field_name}: leave the key out to keep it as it is, or '
                             'send "" to clear it')
        return value

    @model_validator(mode="after")
    def _something_given(self) -> DatasetUpdate:
        if not self.model_fields_set:
            raise ValueError("give at least one of source, licence, description")
        return self


class DatasetVersionSplit(_Body):
    """Split a ready version into a training and a held-out dataset (the version page's "Split into train and
    held-out")."""

    held_out: int | float = Field(description="How many rows to hold out: a fraction in (0, 1) such as 0.1, or a "
                                              "number of rows (a whole number, fewer than the version's).")
    seed: int = Field(default=0, ge=0, description="Draws the rows: the same seed splits the same version the same "
                                                   "way again.")
    stratify: str = Field(default="", description="A column of the file (a label such as task) each of whose values "
                                                  "holds out its share of the rows; \"\" for none.")
    train_name: str | None = Field(default=None, description="The new training dataset's name (default \"<name> "
                                                             "train\").")
    held_out_name: str | None = Field(default=None, description="The new held-out dataset's name (default \"<name> "
                                                                "held-out\").")


class DatasetVersionDerive(_Body):
    """A new version of the dataset written from a ready one (the version page's "Remove the exact repeats" and
    "Remove rows shared with another version")."""

    kind: Literal["dedupe", "decontaminate"] = Field(description="dedupe: keep the first of each exact repeat; "
                                                                 "decontaminate: remove every row that version "
                                                                 "`against` also holds.")
    against: str = Field(default="", description="decontaminate: dv_… id of a ready version of the project, of the "
                                                 "same kind, whose rows to remove (an evaluation set, say).")


class RunResume(_Body):
    max_steps: int | None = Field(default=None, ge=1, description="Train on to this many steps in all.")


class RunRetry(_Body):
    """No field: a retry starts the run's own spec over (to change it, duplicate the run)."""


class CheckpointExport(_Body):
    """No field: the step is the address's."""


class CheckpointServingCopy(_Body):
    scheme: Literal[SERVING_COPY_SCHEMES] = Field(default="int8", description="How the copy's weights are quantized.")


class RunDuplicate(_Body):
    """A copy of a run, launched: its spec as the run page's Duplicate fills the launch form with, these changes
    merged onto it."""

    spec: dict[str, Any] = Field(default_factory=dict, description=(
        "Spec keys to change, as a partial spec merged onto the run's section by section: "
        '{"data": {"train": "dv_…"}} changes data.train and keeps the rest of data; a key given replaces the '
        "whole value of a key that is not a section (a list such as grpo.rewards too); one of a pair of which the "
        "spec takes one (train.max_steps, train.epochs) drops the other. Left out: the run's spec as it is (a date "
        "Temper fixed in data.chat_template_kwargs is fixed anew)."))
    name: str | None = Field(default=None, description=f"At most {RUN_NAME_MAX} characters; left out: the run's name "
                                                        "with ' (copy)'.")
    tags: list[str] | None = Field(default=None, description="Left out: the run's tags, without its sweep's.")


class CheckpointsPrune(_Body):
    keep: list[int] = Field(default_factory=list, max_length=10_000,
                            description="Steps to keep besides the newest and the best (pinned); each must be a "
                                        "checkpoint in the run's folder.")


class MetricsPoint(_Body):
    step: int = Field(ge=0, le=MAX_STORED_INT)
    metrics: dict[str, float] = Field(min_length=1, description="{name: value} logged at this step.")
    tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS, description="Tokens trained on up to this step.")
    # finite: a NaN was dropped after the answer counted it stored (SQLite keeps it as NULL), and an
    # infinity was stored, making the run's series 'Infinity', which JSON readers (the charts) refuse.
    wall_time: FiniteFloat | None = Field(default=None, description="Unix time of the step (default: now).")


class MetricsLog(_Body):
    points: list[MetricsPoint] = Field(min_length=1, max_length=100_000)


class SampleIn(_Body):
    step: int = Field(ge=0, le=MAX_STORED_INT)
    prompt: str | list[dict[str, str]]
    text: str
    answer: str | None = None
    rewards: dict[str, FiniteFloat] | None = None  # stored as JSON, which has no NaN or infinity


class SamplesLog(_Body):
    samples: list[SampleIn] = Field(min_length=1, max_length=10_000)


class RunFinish(_Body):
    status: Literal["succeeded", "failed", "cancelled"]
    message: str = ""


class ChatTokenCreate(_Body):
    """A token of the OpenAI-compatible API (``/v1/``) for one project, as the Chat page makes one."""

    name: str = Field(default=DEFAULT_TOKEN_NAME, json_schema_extra={"maxLength": TOKEN_NAME_MAX},
                      description="What the Chat page lists it by, e.g. where it is used; blank: "
                                  f"{DEFAULT_TOKEN_NAME!r}.")
    # Checked by the view (webapp.core.auth_header.token_expiry), in the words of the pages' forms.
    expires: str = Field(default=DEFAULT_TOKEN_LIFETIME, json_schema_extra={"enum": list(TOKEN_LIFETIMES)},
                         description="After how many days /v1/ refuses it, or never (until revoked).")


# A webhook's fields are checked by ``webhooks.services`` (the page's checks, naming the field); the schemas give
# their types, and the values they take for the OpenAPI document.
_WEBHOOK_URL = ("Where messages are POSTed: http:// or https://, at a public address (a loopback, private or "
                "link-local one only where TEMPER_WEBHOOK_ALLOWED_NETWORKS lists its network); redirects are not "
                "followed. A Slack, Mattermost or Discord incoming webhook's address is a secret itself.")
_WEBHOOK_EVENTS = "The events sent to it (at least one); a ping (POST test/) goes to it whatever it chose."


class ProjectUpdate(_Body):
    """What the project's Settings page changes (owners only); a key left out is left as it is. The slug never
    changes."""

    name: str | None = Field(default=None, description="At most 100 characters, not blank, no invisible characters "
                                                        "(zero-width spaces, bidi controls).")
    description: str | None = Field(default=None, description=f"Plain text, at most {DESCRIPTION_MAX_CHARS:,} "
                                                               "characters (\"\": none).")

    @field_validator("name", "description")
    @classmethod
    def _not_null(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:  # only a value sent is checked: a null sent would otherwise read as left out
            clear = ', or send "" to clear it' if info.field_name == "description" else ""
            raise ValueError(f"null is not a value of {info.field_name}: leave the key out to keep it as it is{clear}")
        return value

    @model_validator(mode="after")
    def _something_given(self) -> ProjectUpdate:
        if not self.model_fields_set:
            raise ValueError("give at least one of name, description")
        return self


class WebhookCreate(_Body):
    """A project's webhook, as the Webhooks page adds one (owners only)."""

    url: str = Field(description=_WEBHOOK_URL)
    events: list[str] = Field(description=_WEBHOOK_EVENTS, json_schema_extra={"items": {"type": "string", "enum": list(EVENTS)}})
    format: str = Field(default=WebhookFormat.JSON.value, json_schema_extra={"enum": WebhookFormat.values},
                        description="json: Temper's payload; slack: {\"text\": …} for Slack, Mattermost and "
                                    "Discord's /slack incoming webhooks.")
    active: bool = Field(default=True, description="false: no event is sent to it (a ping still is).")


class WebhookUpdate(_Body):
    """What the Webhooks page's Edit changes; a key left out is left as it is."""

    url: str | None = Field(default=None, description=_WEBHOOK_URL)
    events: list[str] | None = Field(default=None, description=_WEBHOOK_EVENTS,
                                     json_schema_extra={"items": {"type": "string", "enum": list(EVENTS)}})
    format: str | None = Field(default=None, json_schema_extra={"enum": WebhookFormat.values})
    active: bool | None = None

    @field_validator("url", "events", "format", "active")
    @classmethod
    def _not_null(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:  # only a value sent is checked: a null sent would otherwise read as left out
            raise ValueError(f"null is not a value of {info.field_name}: leave the key out to keep it as it is")
        return value

    @model_validator(mode="after")
    def _something_given(self) -> WebhookUpdate:
        if not self.model_fields_set:
            raise ValueError("give at least one of url, events, format, active")
        return self


class WebhookSecret(_Body):
    """No field: the new secret is made by the server."""


class WebhookTest(_Body):
    """No field: the ping's payload describes the hook."""


class DeliveryRedeliver(_Body):
    """No field: the delivery's recorded payload is sent again."""


class StoragePruneRequest(_Body):
    """No field: every ended run's checkpoints but its newest and its best."""


# Response bodies: what each endpoint answers, for the OpenAPI document. The API's tests validate the server's
# real answers against them (strict, no extra keys), so that the document and the answers cannot drift apart.
class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ProjectLinks(_Answer):
    base_models: str = Field(description="The project's base models (GET base-models/).")
    datasets: str = Field(description="The project's datasets (GET datasets/).")
    runs: str = Field(description="The project's runs (GET runs/; POST launches one).")
    pipelines: str = Field(description="The project's pipelines (GET pipelines/).")
    evaluations: str = Field(description="The project's evaluations (GET evaluations/; POST queues one).")
    activity: str = Field(description="The project's activity log (GET activity/).")
    webhooks: str | None = Field(default=None, description="The project's webhooks (GET webhooks/): owners only, the "
                                                           "key left out for members and viewers.")


class ProjectOut(_Answer):
    slug: str = Field(description="What every other address names: /api/v1/projects/<slug>/….")
    name: str
    description: str = Field(description="What the project is for, as plain text (\"\": none).")
    role: Literal["viewer", "member", "owner"] = Field(
        description="The token's user's role here: viewers read, members also write, owners also upload models and "
                    "manage the project.")
    created_at: datetime
    urls: ProjectLinks


class ProjectList(_Answer):
    projects: list[ProjectOut] = Field(description="The projects the token's user belongs to, by name.")


class LicenceFileNotCopied(_Answer):
    name: str
    bytes: int


class LicenceOut(_Answer):
    license: str | None = Field(description="The licence id its README.md's front matter names (e.g. apache-2.0, "
                                            "llama3.1); null when none.")
    license_name: str | None = Field(description="The licence's name there (for license: other); null when none.")
    license_link: str | None = Field(description="Where its terms are, as that front matter says; null when none.")
    files: list[str] = Field(description="Its licence files (LICENSE, NOTICE, USE_POLICY.md, …) an export copies "
                                         "beside its model card.")
    not_copied: list[LicenceFileNotCopied] = Field(description="Licence files too large for an export to copy (over "
                                                               "1 MiB): copy them by hand before sharing a model.")
    stated: bool = Field(description="Whether the folder states any licence at all (a licence named or a file).")
    built_with_llama: bool = Field(description="Its licence asks a derivative to display \"Built with Llama\" (an "
                                               "export's card says it).")


class BaseModelOut(_Answer):
    id: str = Field(description="bm_… id: what a spec's model names.")
    name: str
    architecture: str
    model_type: str
    parameter_count: int
    context_length: int | None
    vocab_size: int | None
    tokenizer_type: str
    dtype: str
    size_bytes: int
    uploaded: bool = Field(description="Temper unpacked it from an uploaded archive into the project's own folder: "
                                       "an owner's DELETE with ?delete_files=true may delete that folder with it.")
    created_at: datetime
    folder_gone: bool = Field(description="Its folder was deleted from disk since it was registered: a run whose "
                                          "model names it is refused (400 on model) until its files are put back "
                                          "in that folder or it is registered again.")
    licence: LicenceOut | None = Field(description="The licence facts an export carries into its model card, read "
                                                   "from the model's folder; null when that folder may not be read "
                                                   "by this project (gone, or another project's).")


class BaseModelList(_Answer):
    base_models: list[BaseModelOut]


class IssueOut(_Answer):
    code: str | None
    message: str
    line: int | None
    row: int | None
    field: str | None


class CampaignRef(_Answer):
    id: str
    name: str


class _DerivationOut(_Answer):
    source: str = Field(description="dv_… id of the version it was written from (which may be deleted since).")
    dataset: str = Field(description="ds_… id of that version's dataset.")
    dataset_name: str = Field(description="That dataset's name when it was written from it.")
    number: int = Field(description="That version's number.")


class SplitOut(_DerivationOut):
    kind: Literal["split"] = Field(description="A side of a split (POST versions/{number}/split/).")
    side: Literal["train", "held_out"]
    partner: str = Field(description="dv_… id of the other side.")
    fraction: float | None = Field(description="The fraction held out, as asked (null when a count was).")
    count: int | None = Field(description="The rows held out, as asked (null when a fraction was).")
    held_out_rows: int = Field(description="The rows that asked for (duplicates kept together may hold out a few "
                                           "fewer).")
    seed: int
    stratify: str = Field(description="The column each value of which held out its share; \"\" for none.")


class DedupeOut(_DerivationOut):
    kind: Literal["dedupe"] = Field(description="The source without its exact repeats (POST versions/{number}/derive/)."
                                    )
    removed_rows: int = Field(description="The repeats removed (each row's first occurrence kept).")


class DecontaminationOut(_DerivationOut):
    kind: Literal["decontaminate"] = Field(description="The source without the rows another version holds (POST "
                                                       "versions/{number}/derive/).")
    removed_rows: int = Field(description="The source's rows removed, every copy counted.")
    against: str = Field(description="dv_… id of the version whose rows were removed (which may be deleted since).")
    against_name: str = Field(description="That version as it was named: \"qa-eval v2\".")


class DatasetVersionOut(_Answer):
    id: str = Field(description="dv_… id: what a spec's data names.")
    dataset: str = Field(description="ds_… id of its dataset (a version read by its dv_… id says which).")
    number: int
    status: Literal["uploaded", "validating", "ready", "failed"]
    filename: str
    format: str
    size_bytes: int
    row_count: int | None
    error_count: int
    errors: list[IssueOut] = Field(description="The first problems found in the file, when the version failed; "
                                               "[] otherwise.")
    notice: str = Field(description=(
        "While it is being checked (`uploaded`, `validating`): a word on the check that is no problem of the file, "
        "that the check's worker was lost and the check started over; \"\" when there is none. The check's outcome "
        "clears it."))
    mapping: dict[str, str] = Field(description="The column mapping the file is read with, field → column; a field "
                                                "read from a column of its own name is left out.")
    statistics: dict[str, Any] = Field(description="Once ready: character lengths per field (rows, unit, and per "
                                                   "field count, min, max, mean, p50, p90, p99, histogram), exact "
                                                   "duplicates (duplicates: count, rows as [row, earlier row]) and, "
                                                   "for preference data, chats with no assistant turn "
                                                   "(no_assistant_turn: per side, count and rows) and rows whose "
                                                   "chosen is their rejected (identical_pairs: count and rows) "
                                                   "and rows whose chosen and rejected conversations repeat the "
                                                   "prompt's turns, read with them once (prompt_read_once: count "
                                                   "and rows; a version checked before such rows were so read has "
                                                   "none, and its lengths count the prompt in each side, until its "
                                                   "page has it counted again), "
                                                   "for sft and preference data given in LLaMA-Factory's ShareGPT "
                                                   "or Alpaca layout, the rows read so (layouts: per layout, "
                                                   "sharegpt or alpaca, count and rows; absent where every row is "
                                                   "in Temper's own layout), "
                                                   "and for chats, those of a shape some chat templates refuse "
                                                   "(chat_shapes: system_later, same_role_twice, assistant_first; "
                                                   "count and rows each); {} before.")
    created_at: datetime
    review_campaign: CampaignRef | None = Field(description="The review campaign it was exported from, if any.")
    derivation: Annotated[SplitOut | DedupeOut | DecontaminationOut, Field(discriminator="kind")] | None = Field(
        description="Where a version written from another came from, by kind (POST versions/{number}/split/ or "
                    "derive/); null for an upload.")


class DatasetVersionSplitOut(_Answer):
    train: DatasetVersionOut = Field(description="The new training dataset's first version: `uploaded` until a "
                                                 "worker has written and checked it.")
    held_out: DatasetVersionOut = Field(description="The new held-out dataset's first version, likewise.")


class DatasetOut(_Answer):
    id: str
    name: str
    kind: Literal["text", "sft", "preference", "prompts"]
    source: str = Field(description="Where the rows came from (\"\" when not given): an address, a Hugging Face hub "
                                    "id or words.")
    licence: str = Field(description="The terms the rows are under (\"\" when not stated).")
    description: str
    created_at: datetime


class DatasetDetail(DatasetOut):
    versions: list[DatasetVersionOut]


class DatasetList(_Answer):
    datasets: list[DatasetOut]
    next: str | None = Field(description="The address of the next page; null on the last.")


class ComparedVersion(_Answer):
    id: str = Field(description="dv_… id.")
    number: int
    row_count: int


class DatasetComparison(_Answer):
    a: ComparedVersion = Field(description="Version A (a; by default the latest ready version before b).")
    b: ComparedVersion = Field(description="Version B (b; by default the latest ready version).")
    unchanged: int = Field(description="Rows in both, compared as training reads them (after each version's column "
                                       "mapping), as multisets: a row A holds twice and B once is one unchanged, "
                                       "one removed.")
    removed: int = Field(description="Rows of A that B has no counterpart for.")
    added: int = Field(description="Rows of B that A has no counterpart for.")
    removed_rows: list[int] = Field(description="This page of the removed rows: their 1-based numbers in A, "
                                                "ascending.")
    added_rows: list[int] = Field(description="This page of the added rows: their 1-based numbers in B, ascending.")
    next: str | None = Field(description="The address of the next page of either list; null on the last.")


class UploadOut(_Answer):
    dataset: DatasetOut
    version: DatasetVersionOut
    mapping_inherited_from: int | None = Field(
        description="A new version sent without mapping is read with the last version's: that version's number; "
                    "null when the upload sent its own mapping, or there was none to keep.")


class FinalMetric(_Answer):
    last: float
    min: float
    max: float
    step: int


class RunOut(_Answer):
    id: str = Field(description="run_… id.")
    name: str
    task: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    error_message: str = Field(description="Why it failed or was cancelled (an external run's closing message); \"\" "
                                           "while it is queued or running.")
    notice: str = Field(description=(
        "While it is queued again after its worker was lost: which attempt was lost, at which step, and the "
        "checkpoint the next attempt resumes from; no failure. \"\" otherwise: its next attempt's start clears it, "
        "and the run's log keeps it."))
    stopping: bool = Field(description="Cancelled while training: the run stops after its current step (an "
                                       "evaluation or a rollout can take minutes), and is running until then.")
    attempt: int
    current_step: int
    total_steps: int | None
    tokens_seen: int
    tags: list[str]
    archived: bool
    created_at: datetime
    finished_at: datetime | None
    final_metrics: dict[str, FinalMetric]


class ArtifactOut(_Answer):
    kind: Literal["model", "adapter", "checkpoint"]
    step: int = Field(description="The step it holds: a checkpoint's, or for the model and the adapter the run's "
                                  "last (the export is written over by a resume).")
    size_bytes: int
    folder_gone: bool = Field(description="Its folder was deleted from disk since it was exported: a run whose model "
                                          "names it (run_…, run_…@step) is refused (400 on model), and its download "
                                          "is a 404.")
    url: str = Field(description="The address that downloads it as a tar (a checkpoint's with ?step=).")
    card_url: str | None = Field(description="The address of its model card (Markdown); null for an export written "
                                             "before exports had cards.")


class RunDetail(RunOut):
    spec: dict[str, Any] = Field(description="The job spec as written (ids, not paths); an external run's config.")
    summary: dict[str, Any] = Field(description="The engine's summary of the run ({} until it ends).")
    notes: str
    artifacts: list[ArtifactOut]


class RunPage(_Answer):
    runs: list[RunOut]
    next: str | None = Field(description="The address of the next page (it keeps the query); null on the last.")


class SweepOut(_Answer):
    sweep: str = Field(description="The sweep's tag (sweep-…).")
    runs: list[RunDetail]


class Series(_Answer):
    step: list[int]
    value: list[float]
    tokens: list[int | None]
    time: list[float | None] = Field(description="Seconds since the run's first point.")
    downsampled: bool


class MetricSeries(_Answer):
    series: dict[str, Series] = Field(description="By metric name: those asked for (names; every one when left out) "
                                                  "that have points after after_step.")
    unknown_names: list[str] = Field(description="The names asked for that the run has logged no point of (a typo, "
                                                 "or a metric not logged yet), in the order asked; [] when names is "
                                                 "left out. A name whose points all lie before after_step is known.")
    metric_names: list[str] = Field(description="Every metric the run has logged a point of, sorted: the names "
                                                "names may ask for.")


class SkippedValue(_Answer):
    step: int
    name: str
    why: str


class MetricsLogged(_Answer):
    stored: int
    skipped: int
    skipped_values: list[SkippedValue]


class SampleOut(_Answer):
    step: int
    position: int
    prompt: str | list[dict[str, Any]]
    text: str
    answer: str | None
    rewards: dict[str, float] | None
    reward: float | None


class SampleList(_Answer):
    samples: list[SampleOut]
    next: str | None = Field(description="The address of the next page (it keeps the query); null on the last.")


class LogLine(_Answer):
    id: int = Field(description="The line's id: send it as after to read the lines after it.")
    time: datetime
    level: Literal["info", "warning", "error"]
    message: str


class RunLog(_Answer):
    lines: list[LogLine] = Field(description="Oldest first.")
    next: str | None = Field(description="The address of the lines after these (it keeps the query, without "
                                         "tail); null once the run has ended and its log is read to the end.")


class SamplesStored(_Answer):
    stored: int


class PipelineOut(_Answer):
    id: str
    name: str
    status: Literal["running", "succeeded", "stopped", "failed", "cancelled"]
    current_stage: int
    message: str
    result_run: str | None
    cancelled_by: str = Field(description="Who cancelled the pipeline itself: a username, or \"the system\"; empty "
                                          "when nobody did (one that ended cancelled because its stage's run was "
                                          "cancelled goes on when that run is resumed, one a person cancelled "
                                          "does not).")
    stages: list[dict[str, Any]] = Field(description="The stages as sent, each with its run's id under run (null "
                                                     "until it starts).")


class EvaluationCreate(_Body):
    """Evaluate a model of the project on a ready dataset version, as the New evaluation page does; or, with run
    instead of model, every model of a run, as its page's *Evaluate every checkpoint…* does."""

    model: str | None = Field(default=None, description="The model as the chat names it: a base model (bm_…), a "
                                                        "succeeded run's model (run_…) or an exported checkpoint "
                                                        "(run_…:step-N or run_…@N). Give model or run, not both.")
    run: str | None = Field(default=None, description=(
        "Instead of model, a run (run_…): one evaluation per exported checkpoint and its final model, for the run "
        "page's curve across steps, checked all or nothing; a model evaluated so already (same version, metric, "
        "rows, tokens, answer column or reward functions; succeeded, queued or running) is skipped, and at most "
        "20 are queued a request, spread over the steps: send it again for the rest. The answer is "
        'RunEvaluationsOut.'))
    dataset_version: str = Field(description="A ready dataset version (dv_…): prompts with reference answers "
                                             "(answer_column; exact match of greedy completions, or reward_terms) "
                                             "or sft (mean completion loss).")
    row_limit: int = Field(default=200, description="Score the first rows only (1 to 5,000).")
    max_new_tokens: int = Field(default=32, description="Exact match, reward functions: tokens per greedy "
                                                        "completion (1 to 1,024).")
    group_by: str = Field(default="", description="Exact match, reward functions: a column whose values each get "
                                                  "their own figure (e.g. task); empty for none.")
    answer_column: str = Field(default="answer", description="Exact match: the column of reference answers (as "
                                                             "jaxengine eval's --answer-column); every row read must "
                                                             "have it as text.")
    reward_terms: list[dict[str, Any]] | None = Field(default=None, description=(
        "A prompts version scored by reward functions instead of exact match (metric rewards): the list a GRPO "
        "spec gives as grpo.rewards, [{name, weight, args}], checked as it is (a reward_model's model a reward run "
        "of the project, run_…); a refusal names reward_terms.<n>.<key>. Null or left out: exact match."))

    @model_validator(mode="after")
    def _one_model_or_run(self) -> EvaluationCreate:
        if (self.model is None) == (self.run is None):
            raise ValueError("give exactly one of model and run (run_…: every exported checkpoint of the run)")
        return self


class EvaluationOut(_Answer):
    id: str = Field(description="ev_…")
    model: str = Field(description="The model's reference (bm_…, run_…, run_…:step-N).")
    model_label: str
    dataset_version: str | None = Field(description="dv_…; null once the version was deleted.")
    version_label: str
    metric: Literal["exact_match", "rewards", "loss"]
    row_limit: int
    max_new_tokens: int
    group_by: str
    answer_column: str
    reward_terms: list[dict[str, Any]] = Field(description="Metric rewards: the reward functions, {name, weight, "
                                                           "args} each; [] for another metric.")
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    rows_done: int = Field(description="Exact match and rewards: the rows whose completions are generated so far, "
                                       "counted after each slice the serve worker generates; 0 for loss.")
    rows_total: int = Field(description="The rows being scored, once the serve worker has started generating (0 "
                                        "before, and for loss).")
    result: dict[str, Any] = Field(description="Once succeeded: jaxengine eval's object (metric, value, count, groups "
                                               "with group_by, the first completions as examples; for rewards, value "
                                               "the mean weighted total and terms each function's mean); {} before.")
    error: str = Field(description="Why it failed, or who cancelled it; empty otherwise.")
    created_by: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None


class RunEvaluationsOut(_Answer):
    run: str = Field(description="run_…")
    evaluations: list[EvaluationOut] = Field(description="Those queued, in step order (the final model last); [] "
                                                         "when every model was evaluated so already.")
    skipped: int = Field(description="Models skipped: evaluated so already, or being evaluated.")
    left: int = Field(description="Models past the 20 queued a request: send the request again (with another "
                                  "Idempotency-Key) to queue them.")
    not_exported: int = Field(description="Checkpoints saved but not exported, which nothing can score: export them "
                                          "(POST runs/{run_id}/checkpoints/{step}/export/) first.")


class EvaluationList(_Answer):
    evaluations: list[EvaluationOut]
    next: str | None = Field(description="The address of the next page; null on the last.")


class PipelineList(_Answer):
    pipelines: list[PipelineOut]
    next: str | None = Field(description="The address of the next page; null on the last.")


class ActivityTarget(_Answer):
    kind: str = Field(description="run, sweep, pipeline, dataset, dataset_version, base_model, member, chat_token, "
                                  "campaign, evaluation or webhook.")
    id: str = Field(description="Its public id (run_…, ds_…, wh_…; a sweep's tag; a member's username; a project "
                                "token's first characters).")
    label: str = Field(description="Its name when it was done (a webhook's: the host of its address).")
    exists: bool = Field(description="False once it has been deleted.")
    url: str | None = Field(description="Its page while it exists (null for a project token, for a webhook unless you "
                                        "are an owner, and once deleted).")


class ActivityEntry(_Answer):
    id: int
    created_at: str = Field(description="When, ISO 8601.")
    actor: str | None = Field(description="The username of who did it, as it was then; null for manage.py.")
    actor_shown: str = Field(description="Who, as the Activity page shows them: the name, \"deleted account <name>\" "
                                         "or \"manage.py\".")
    verb: str = Field(description="What was done, e.g. run.launched, run.deleted, member.role_changed.")
    target: ActivityTarget | None = Field(description="What it was done to; null for the project itself.")
    details: dict[str, Any] = Field(description="A few facts of it: the role given, the steps deleted, bytes freed.")


class ActivityList(_Answer):
    activity: list[ActivityEntry]
    next: str | None = Field(description="The address of the next (older) page; null on the last.")


class ChatTokenOut(_Answer):
    id: int = Field(description="What DELETE chat-tokens/<id>/ names.")
    name: str
    prefix: str = Field(description="The token's first characters, to recognise it.")
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None = Field(description="From then on /v1/ refuses it; null: it works until revoked.")
    expired: bool


class ChatTokenCreated(ChatTokenOut):
    token: str | None = Field(description="The secret (tpk_…) to send to /v1/ as 'Authorization: Bearer <token>': in "
                                          "this answer only, it is not stored; null in the answer to a repeat with "
                                          "the first request's Idempotency-Key, which made nothing.")
    base_url: str = Field(description="The address of the OpenAI-compatible API: an OpenAI client's base_url.")


class ChatTokenList(_Answer):
    tokens: list[ChatTokenOut] = Field(description="Your own tokens for the project, newest first (an owner sees "
                                                   "theirs only, as on the Chat page).")


class StorageByKind(_Answer):
    checkpoint_bytes: int = Field(description="The runs' training checkpoints (checkpoints/ of each run directory).")
    export_bytes: int = Field(description="The runs' exported models and checkpoints (export/, export-step-N/), "
                                          "with the serving copies inside them.")
    run_other_bytes: int = Field(description="The rest of the run directories: logs, metrics, samples, spec.")
    run_bytes: int = Field(description="The three above together.")
    dataset_bytes: int = Field(description="Every dataset version's file, with its row digests and search index.")
    base_model_bytes: int = Field(description="Base models' folders under Temper's data directory or uploaded, "
                                              "and every base model's serving copy.")
    outside_bytes: int = Field(description="Base models registered from folders outside Temper's data directory: "
                                           "not in total_bytes.")


class RunStorageOut(_Answer):
    id: str
    name: str
    status: str
    archived: bool
    checkpoints: int = Field(description="Training checkpoints on disk (one folder per saved step).")
    checkpoint_bytes: int
    export_bytes: int
    other_bytes: int
    total_bytes: int
    folder_gone: bool = Field(description="The run wrote a folder that is no longer on disk: every size is 0.")
    prunable_bytes: int = Field(description="What pruning its checkpoints (POST runs/<id>/checkpoints/prune/) would "
                                            "free now: all but the newest and the best; 0 while the run is active.")


class DatasetStorageOut(_Answer):
    id: str
    name: str
    versions: int
    bytes: int
    folder_gone: bool


class BaseModelStorageOut(_Answer):
    id: str
    name: str
    path: str
    uploaded: bool
    bytes: int = Field(description="Its folder's.")
    serving_copy_bytes: int
    outside_data_directory: bool = Field(description="Registered by reference to a folder outside Temper's data "
                                                     "directory: its bytes are shown, not counted in total_bytes.")
    folder_gone: bool


class FilesystemSpace(_Answer):
    setting: str = Field(description="TEMPER_DATA, or TEMPER_MODELS_ROOT where the models root is on another "
                                     "filesystem.")
    free_bytes: int = Field(description="Free space an unprivileged writer may use (statvfs, kept up to 5 s).")
    filesystem_bytes: int = Field(description="The filesystem's size.")
    low: bool = Field(description="Free space under TEMPER_DISK_WARN_FREE_BYTES (unset: 5 GiB or 5 % of the filesystem, "
                                  "whichever is smaller): the pages show a warning banner.")


class ProjectStorage(_Answer):
    total_bytes: int = Field(description="Everything below but outside_bytes, on disk as du counts it (blocks, a "
                                         "hard-linked file once, links not followed).")
    measured_at: datetime = Field(description="When the folders were walked: now, on every request.")
    free_bytes: int = Field(description="Free space of the filesystem holding the data directory (TEMPER_DATA).")
    filesystem_bytes: int = Field(description="That filesystem's size.")
    filesystems: list[FilesystemSpace] = Field(description="The data directory's filesystem, then the models root's "
                                                           "where it is another one.")
    by_kind: StorageByKind
    runs: list[RunStorageOut] = Field(description="Every run of the project, largest first.")
    datasets: list[DatasetStorageOut] = Field(description="Every dataset, largest first.")
    base_models: list[BaseModelStorageOut] = Field(description="Every base model, largest counted first.")


class CheckpointPrunedOut(_Answer):
    step: int
    bytes: int = Field(description="The disk its folder took, as du counts it: freed.")


class CheckpointKeptOut(_Answer):
    step: int
    reasons: list[str] = Field(description="Why it stays: the newest (Resume / Train further restores it), the best "
                                           "by the run's ranking metric, pinned, or why deleting it is refused now "
                                           "(being exported, a serving copy being written).")


class CheckpointsPruned(_Answer):
    deleted: list[CheckpointPrunedOut] = Field(description="The training checkpoints deleted, oldest first (their "
                                                           "exports, if any, stay).")
    kept: list[CheckpointKeptOut] = Field(description="The training checkpoints left, oldest first.")
    bytes_freed: int


class CheckpointScoreOut(_Answer):
    metric: str = Field(description="The run's ranking metric (eval loss, or RL's first eval metric).")
    value: float = Field(description="Its value as last evaluated at or before the checkpoint's step.")
    at: int = Field(description="The step that evaluation was at.")
    best: bool = Field(description="The checkpoint the trainer keeps as best (of those evaluated at their own step).")


class CheckpointExportOut(_Answer):
    status: Literal["exporting", "exported", "failed"]
    error_message: str = Field(description="Why it failed; \"\" otherwise (export it again).")
    notice: str = Field(description="While exporting: its worker was lost once and it was queued again; \"\" "
                                    "otherwise.")


class ServingCopyStateOut(_Answer):
    state: Literal["none", "writing", "ready", "failed"]
    scheme: str = Field(description="The copy's scheme (int8, int4) being written, failed or ready; \"\" for none.")
    served: str = Field(description="The scheme of the whole copy that serves now (\"\": none): a copy made again "
                                    "serves the old one until the new one is whole.")
    message: str = Field(description="Why it failed, or while writing, that its worker was lost once; \"\" "
                                     "otherwise.")


class CheckpointDeletionOut(_Answer):
    refusal: str = Field(description="Why DELETE checkpoints/<step>/ is refused now; \"\" when it is not.")
    notes: list[str] = Field(description="What deleting it changes (its weights gone where no export keeps them, "
                                         "what Resume then goes on from, that it is the best), as the run page's "
                                         "confirmation says; empty when refused.")


class CheckpointOut(_Answer):
    step: int
    saved_at: str | None = Field(description="When its training checkpoint's newest file was written (ISO 8601); "
                                             "null when that folder is gone and only its export is left.")
    size_bytes: int | None = Field(description="The disk its training checkpoint (checkpoints/<step>) takes, as du "
                                               "counts it; null when that folder is gone.")
    model: str | None = Field(description="What a run starts from to use its weights (the spec's model): run_…@<step> "
                                          "once exported, the run's id for its final model; null otherwise (POST "
                                          "checkpoints/<step>/export/ makes it).")
    download_url: str | None = Field(description="Its export as a tar archive (GET artifacts/checkpoint/?step=N); "
                                                 "null until exported.")
    card_url: str | None = Field(description="Its export's model card as Markdown (GET artifacts/checkpoint/card/"
                                             "?step=N); null until exported, or for an export written before cards.")
    export: CheckpointExportOut | None = Field(description="The last export asked for; null for none (a final "
                                                           "model is exported when its run succeeded).")
    final: bool = Field(description="The run's final model (the last step of a succeeded run), not exported again.")
    score: CheckpointScoreOut | None = Field(description="What ranks it; null before any evaluation, or for a run "
                                                         "with no ranking metric.")
    serving_copy: ServingCopyStateOut | None = Field(description="Its export's quantized copy the chat serves; null "
                                                                 "until exported, or for a model that writes no text.")
    deletion: CheckpointDeletionOut | None = Field(description="For who may delete the run, once it has ended, of a "
                                                               "training checkpoint still in its folder: whether "
                                                               "DELETE checkpoints/<step>/ is refused, else what it "
                                                               "changes; null otherwise.")


class CheckpointList(_Answer):
    checkpoints: list[CheckpointOut] = Field(description="Oldest first: the run folder's training checkpoints and "
                                                         "those exported, as the run page's Checkpoints lists them.")


class CheckpointExportQueued(_Answer):
    step: int
    model: str = Field(description="The run_…@<step> a run's spec names as its model once the export is done.")
    export: CheckpointExportOut = Field(description="As GET checkpoints/ lists it: exporting until the train "
                                                    "queue's worker has written it.")


class CheckpointServingCopyQueued(_Answer):
    step: int
    queued: bool = Field(description="Whether the request queued the copy (a repeat with the first's Idempotency-Key: "
                                     "whether the first did): false while one asked for before is still being "
                                     "written.")
    serving_copy: ServingCopyStateOut = Field(description="As GET checkpoints/ lists it: writing until a serve "
                                                          "worker has written it.")


class WebhookOut(_Answer):
    id: str = Field(description="wh_… id.")
    url: str = Field(description="Where messages are POSTed (a chat's incoming-webhook address is a secret itself).")
    events: list[str]
    format: Literal[tuple(WebhookFormat.values)]
    active: bool
    secret: str = Field(description="A secret (whsec_…): the key a receiver checks X-Temper-Signature with. Shown "
                                    "to the project's owners only, as on the Webhooks page; keep it out of logs. POST "
                                    "secret/ replaces it.")
    created_at: datetime
    deliveries_url: str = Field(description="Its deliveries, newest first (GET deliveries/).")


class WebhookList(_Answer):
    webhooks: list[WebhookOut] = Field(description="The project's webhooks, oldest first.")


class DeliveryOut(_Answer):
    id: str = Field(description="whd_… id: the X-Temper-Delivery header of its messages.")
    event: str
    status: Literal[tuple(DeliveryStatus.values)] = Field(
        description="pending (being sent, or waiting for a retry at next_attempt_at), delivered (a 2xx answer), "
                    "failed (its retries spent, or its address refused).")
    attempts: int
    last_status_code: int | None = Field(description="The HTTP status of the last answer; null when none came.")
    last_error: str = Field(description="Why the last attempt failed, in words (\"\" once delivered).")
    last_response: str = Field(description="The first 200 characters of the last answer, never more.")
    next_attempt_at: datetime | None
    created_at: datetime
    payload: dict[str, Any] = Field(description="The payload as recorded when the event happened (its links made "
                                                "absolute, sent_at and delivery stamped on each attempt).")


class DeliveryList(_Answer):
    deliveries: list[DeliveryOut] = Field(description="Newest first. A hook keeps its newest 200 deliveries.")
    next: str | None = Field(description="The address of the next (older) page; null on the last.")


class PruneFailureOut(_Answer):
    run: str = Field(description="The run's id (run_…), \"\" for a failure of the prune as a whole.")
    name: str
    why: str


class ProjectPruneOut(_Answer):
    state: Literal["queued", "running", "finished", "never_started", "stopped"] = Field(
        description="queued: waiting for a worker of the default queue; running; finished; never_started: no worker "
                    "took it before it went stale (start one, then prune again); stopped: its worker was lost part "
                    "way (you may prune again).")
    requested_at: datetime
    requested_by: str | None = Field(description="The owner who asked for it; null for a deleted account.")
    runs_done: int
    runs_total: int | None = Field(description="The runs with checkpoints to weigh; null until a worker starts it.")
    checkpoints_deleted: int
    bytes_freed: int
    failures: list[PruneFailureOut] = Field(description="The runs it left, with why.")
    finished_at: datetime | None


class ProjectPruneState(_Answer):
    prune: ProjectPruneOut | None = Field(description="The newest project-wide prune; null when none was asked for.")


class FieldErrors(_Answer):
    errors: dict[str, list[str]] = Field(description="Messages by the field they are about (__all__: the body).")


class Detail(_Answer):
    detail: str
