"""Training runs and what they record.

A ``Run`` is one training job of a project: the spec a person wrote (``spec``: models and datasets
named by their public ids, no paths) and the spec the engine runs (``resolved_spec``: paths filled
in, ``output_dir`` under ``DATA_ROOT/runs/<public id>``). The train worker reports into it: progress
fields and a heartbeat on the run row, one ``MetricPoint`` per logged metric and step, ``Sample``s
(the generations at each evaluation), ``RunLogLine``s, and ``Artifact``s (exported model, adapter)
at the end.

``attempt`` counts how often the run was enqueued (launch, resume, re-queue after a lost worker).
Each queued message carries its attempt number, and a worker drops a message whose attempt is not
the run's current one, so a message that Redis redelivers late never runs a job twice.
"""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import models
from django.utils import timezone

from jaxengine.model_card import CARD_FILE as MODEL_CARD_FILE
from webapp.basemodels.models import BaseModel
from webapp.core.ids import PUBLIC_ID_MAX_LENGTH, new_public_id
from webapp.datasets.models import DatasetVersion
from webapp.projects.models import Project


def new_run_id() -> str:
    return new_public_id("run")


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


# A run's status in a sentence (Run.status_phrase).
STATUS_PHRASES = {RunStatus.QUEUED: "is queued", RunStatus.RUNNING: "is running", RunStatus.SUCCEEDED: "has succeeded",
                  RunStatus.FAILED: "has failed", RunStatus.CANCELLED: "was cancelled"}
ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING)


def status_phrase(status: str) -> str:
    """A run status (or an attempt's) as a sentence says it after its subject: "has succeeded", not "is
    succeeded"."""
    return STATUS_PHRASES[status]
FINISHED_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


REWARD_TASK = "reward"


STAMPED_TEMPLATE_DATE_HELP = (
    "The data.chat_template_kwargs.date_string Temper fixed in the spec at launch (runs.services._fix_template_date), "
    "empty where the spec or the model's own variables gave one or the template stamps no day. A retry keeps it; a "
    "copy of the run leaves a date so fixed out, for its own launch to fix its own day (runs.services.spec_of_a_copy).")


class Run(models.Model):
    public_id = models.CharField(max_length=PUBLIC_ID_MAX_LENGTH, unique=True, default=new_run_id)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runs")
    name = models.CharField(max_length=120)
    task = models.CharField(max_length=20)
    spec = models.JSONField(help_text="The spec as written: models and datasets by public id, no output_dir.")
    resolved_spec = models.JSONField(help_text="The spec the engine runs: paths and output_dir filled in.")
    status = models.CharField(max_length=12, choices=RunStatus.choices, default=RunStatus.QUEUED)
    error_message = models.TextField(blank=True)
    notice = models.TextField(blank=True, default="", help_text=(
        "While re-queued after its worker was lost (services.run_attempt_lost): which attempt was lost, where, and "
        "where the next one starts; no failure. Its next attempt's start clears it; error_message holds failures."))
    attempt = models.PositiveIntegerField(default=1)
    cancel_requested = models.BooleanField(default=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    # When the current attempt was queued: a run queued for long whose message is in no queue
    # (Redis lost it) is sent again (``services.runs_requeue_lost_messages``).
    queued_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    total_steps = models.PositiveIntegerField(null=True)
    current_step = models.PositiveIntegerField(default=0)
    tokens_seen = models.BigIntegerField(default=0)
    # Seconds the attempts took, each from its start (its model's loading and compiling included, as the run page's
    # Elapsed counts them while it starts), up to the current attempt's latest step.
    train_seconds = models.FloatField(default=0.0)
    worker_name = models.CharField(max_length=255, blank=True)
    # Multi-host runs (spec ``hosts`` > 1): the attempt's workers, one per process, once placed
    # ({"pool": ..., "coordinator": "host:port", "hosts": [{"process": 0, "worker": ..., "address": ...}]}),
    # and while the run waits for them, why ("waiting for 2 workers of pool tpu: 1 free").
    hosts = models.PositiveIntegerField(default=1)
    placement = models.JSONField(default=dict, blank=True)
    waiting_reason = models.CharField(max_length=255, blank=True)
    last_heartbeat = models.DateTimeField(null=True)
    # Attempts lost one after another (``services.run_attempt_lost``) with no new checkpoint between them, and the
    # latest checkpoint's step at the last of them (None: none saved): a run killed at the same step again and
    # again (out of memory there, a batch that crashes the process) fails at TEMPER_RUN_LOST_LIMIT instead of
    # being re-queued for ever. A resume counts afresh.
    lost_in_a_row = models.PositiveIntegerField(default=0)
    lost_after_checkpoint = models.PositiveIntegerField(null=True, blank=True)
    summary = models.JSONField(default=dict, blank=True)
    # {"loss": {"last": 1.2, "min": 0.9, "max": 3.4, "step": 120}, ...}: filled as points arrive.
    final_metrics = models.JSONField(default=dict, blank=True)
    # NaN and infinity are not stored as points (a chart cannot draw them), so final_metrics holds each
    # metric's last finite value; this holds, per metric, the latest step it was logged not finite at:
    # {"eval/loss": {"step": 120, "value": "nan"}} ("nan", "inf" or "-inf"). A metric's latest value was
    # not finite when its step here is after final_metrics' (selectors.latest_not_finite).
    not_finite_metrics = models.JSONField(default=dict, blank=True)
    # A finished run's downsampled series, computed once when it ends (the compare page reads these
    # instead of aggregating every point again): {"max_points": 1000, "series": {...}}.
    series_cache = models.JSONField(default=dict, blank=True)
    tags = models.JSONField(default=list, blank=True)
    notes = models.TextField(blank=True, help_text="Markdown.")
    archived = models.BooleanField(default=False)
    base_model = models.ForeignKey(BaseModel, on_delete=models.SET_NULL, null=True, blank=True, related_name="runs")
    source_run = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="derived_runs", help_text="The run whose exported model this run starts from.")
    dataset_versions = models.ManyToManyField(DatasetVersion, blank=True, related_name="runs")
    # What each dataset version of the spec was called when the run was launched, {"dv_…": {"name": "chats",
    # "number": 2}}: its pages name the data it trained on after the version is deleted (``deleted_references``).
    dataset_names = models.JSONField(default=dict, blank=True)
    pipeline = models.ForeignKey("Pipeline", on_delete=models.SET_NULL, null=True, blank=True, related_name="runs")
    pipeline_stage = models.PositiveIntegerField(null=True, blank=True)
    stamped_template_date = models.TextField(blank=True, default="", help_text=STAMPED_TEMPLATE_DATE_HELP)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["project", "-created_at"], name="run_project_created"),
            models.Index(fields=["status", "last_heartbeat"], name="run_status_heartbeat"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=[status.value for status in RunStatus]), name="run_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.public_id})"

    @property
    def output_dir(self) -> Path:
        return Path(self.resolved_spec["output_dir"])

    @property
    def data_spec(self) -> dict:
        """The spec's ``data`` section as the user wrote it (dataset public ids), ``{}`` when absent."""
        return (self.spec or {}).get("data") or {}

    def datasets_by_use(self) -> list[tuple[str, DatasetVersion]]:
        """The run's dataset versions with what the spec uses each for, training data first:
        ``[("train", version), ("eval", version)]`` (one version may be both), then any the spec does not
        name with use ``""``. Reads ``dataset_versions.all()``, so a prefetched list costs no query."""
        by_id = {version.public_id: version for version in self.dataset_versions.all()}
        data = self.data_spec
        named = [(use, by_id[data[use]]) for use in ("train", "eval") if data.get(use) in by_id]
        unnamed = by_id.keys() - {version.public_id for _use, version in named}
        return named + [("", version) for public_id, version in by_id.items() if public_id in unnamed]

    @property
    def started_from_a_run(self) -> bool:
        """Whether the spec starts from a run's model (``run_…``), that run perhaps deleted since: its
        ``base_model`` is then the one at the root of the chain, not what it started from."""
        model = self.spec.get("model") if isinstance(self.spec, dict) else None
        return isinstance(model, str) and model.startswith("run_")

    def recorded_dataset_name(self, public_id: str) -> dict | None:
        """``{"name": ..., "number": ...}`` of dataset version ``public_id`` as the run's launch recorded it; None for
        runs launched before it was recorded whose version was already deleted."""
        recorded = (self.dataset_names or {}).get(public_id)
        return recorded if isinstance(recorded, dict) and {"name", "number"} <= recorded.keys() else None

    def deleted_references(self) -> list[tuple[str, str]]:
        """``(use, id)`` for what the spec names that is gone (deleted since): ``("model", "bm_…")`` when its
        base model is, ``("model", "run_…")`` when the run it started from is, ``("train" | "eval", "dv_…")``
        for dataset versions. The history says so instead of dropping the line. Reads
        ``dataset_versions.all()`` (prefetched in the table)."""
        gone = []
        model = self.spec.get("model") if isinstance(self.spec, dict) else None
        if isinstance(model, str) and ((model.startswith("bm_") and self.base_model_id is None)
                                       or (model.startswith("run_") and self.source_run_id is None)):
            gone.append(("model", model))
        present = {version.public_id for version in self.dataset_versions.all()}
        data = self.data_spec
        gone += [(use, data[use]) for use in ("train", "eval")
                 if isinstance(data.get(use), str) and data[use].startswith("dv_") and data[use] not in present]
        return gone

    @property
    def generates_text(self) -> bool:
        """Whether the run's model writes text: a reward run's scores it (a value head), so it has no eval
        previews, no serving copy, and no place in the chat's model lists."""
        return self.task != REWARD_TASK

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def status_phrase(self) -> str:
        """The status as a sentence says it after "run X": "is running", "has succeeded", not "is succeeded"."""
        return status_phrase(self.status)

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def is_stopping(self) -> bool:
        """Running with a cancel asked for: the worker stops after its current step (an evaluation or a
        rollout can take minutes), saving a checkpoint."""
        return self.status == RunStatus.RUNNING and self.cancel_requested

    @property
    def shown_status(self) -> str:
        """The status as the pages show it: ``stopping`` for a run that is stopping."""
        return "stopping" if self.is_stopping else self.status

    @property
    def progress_fraction(self) -> float:
        if not self.total_steps:
            return 0.0
        return min(1.0, self.current_step / self.total_steps)


class RunTag(models.Model):
    """One tag of a run, beside the run's ``tags`` list (what the pages show, in its order): the runs table's search
    and tag menu read these rows, an index range of the project, instead of every run's list. Written only with the
    list, by ``services.run_tags_write``, so the two never disagree. ``tag_folded`` is the tag casefolded
    (``fold_tag``), for a search that matches a part of a tag case aside, "CAFÉ" finding "café", in the database."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tag_rows")
    # The run's project, kept here so that the search and the menu read one project's rows from an index.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    # Text, not a bounded CharField: tags stored before parse_tags limited them to 40 characters are copied whole.
    tag = models.TextField()
    tag_folded = models.TextField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "tag"], name="runtag_unique_run_tag")]
        indexes = [
            models.Index(fields=["project", "tag"], name="runtag_project_tag"),
            models.Index(fields=["project", "tag_folded"], name="runtag_project_folded"),
        ]


def fold_tag(text: str) -> str:
    """A tag, or a search for a part of one, as ``RunTag.tag_folded`` holds it: casefolded."""
    return text.casefold()


class ProjectMetricName(models.Model):
    """A final metric some run of the project logged: what the runs table's sort menu offers
    (``selectors.project_metric_names``), read from these rows rather than from every run's ``final_metrics``.
    Every writer of a run's ``final_metrics`` adds its names in its transaction (``services.metric_names_note``);
    a run's deletion, and a writer that recomputes them without a name (an attempt that starts over drops the steps
    an earlier one logged: ``services.metric_names_rewritten``), take out the names no other run of the project
    holds, while an archived run's stay: the table lists archived runs too, and sorts them by those."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="metric_names")
    name = models.CharField(max_length=100)  # MetricPoint.name's

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="projectmetricname_unique")]


class PipelineStatus(models.TextChoices):
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    STOPPED = "stopped", "Stopped by a guard"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


def new_pipeline_id() -> str:
    return new_public_id("pl")


class Pipeline(models.Model):
    """Stages launched once, each starting from the previous stage's exported model (see
    ``webapp.runs.pipelines``). ``result_run`` is the run whose model is the pipeline's result: the
    last stage that succeeded and passed its guard."""

    public_id = models.CharField(max_length=PUBLIC_ID_MAX_LENGTH, unique=True, default=new_pipeline_id)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="pipelines")
    name = models.CharField(max_length=120)
    # [{"name": "sft", "spec": {...}, "guard": {"metric": ..., "max_drop_percent": ..., "higher_is_better": ...}}]
    stages = models.JSONField()
    status = models.CharField(max_length=12, choices=PipelineStatus.choices, default=PipelineStatus.RUNNING)
    current_stage = models.PositiveIntegerField(default=0)
    result_run = models.ForeignKey("Run", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    message = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True)
    # When a worker took the export stage and began writing its serving copy: from then on a cancel must wait.
    export_started_at = models.DateTimeField(null=True)
    # Who cancelled the pipeline itself (``pipeline_cancel``): a username, or "the system"; blank when it was not
    # (a pipeline ended cancelled by its stage's run follows a resume of that run, one a person cancelled does not).
    # Their name, not a key: it outlives their account, which would otherwise turn it into a stage's cancel.
    cancelled_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.public_id})"


class MetricPoint(models.Model):
    """One logged value: metric ``name`` of ``run`` at ``step``. Replays never duplicate a step."""

    # The foreign key's own index stays, although the indexes below start with the run too: on SQLite its
    # entries end with the row id, so it is a (run, id) index, and the points stored since a run's stored buckets
    # (id > through_id) and its newest point's id are ranges of it; the others would read every point of the run
    # (test_selectors.py::test_the_points_since_stored_buckets_and_the_newest_point_are_found_without_reading_the_run).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_points")
    step = models.PositiveIntegerField()
    name = models.CharField(max_length=100)
    value = models.FloatField()
    wall_time = models.FloatField(help_text="Unix time when the worker received the point.")
    tokens = models.BigIntegerField(default=0, help_text="Tokens trained on up to this step, over all attempts.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "name", "step"], name="metricpoint_unique_run_name_step"),
        ]
        indexes = [
            # A poll that finds new points times them from the run's first point (selectors._start_time):
            # MIN(wall_time) of one run, read from this index's first entry rather than every point.
            models.Index(fields=["run", "wall_time"], name="metricpoint_run_wall_time"),
            # A poll asks for the points after a step (selectors.metric_series): a range of this index, where
            # the unique (run, name, step) one has every point of the run read to find them.
            models.Index(fields=["run", "step"], name="metricpoint_run_step"),
        ]


class Sample(models.Model):
    """One generation logged at an evaluation (or one rollout): the prompt, the text, its rewards."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="samples")
    step = models.PositiveIntegerField()
    position = models.PositiveIntegerField(help_text="Order within the step (the eval prompt's index).")
    prompt = models.JSONField(help_text="A string, or a list of {role, content} messages.")
    text = models.TextField()
    answer = models.TextField(blank=True)
    rewards = models.JSONField(default=dict, blank=True, help_text="{reward function: value}, for rollouts.")
    reward = models.FloatField(null=True)
    extra = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["step", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "step", "position"], name="sample_unique_run_step_position"),
        ]


class LogLevel(models.TextChoices):
    INFO = "info", "Info"
    WARNING = "warning", "Warning"
    ERROR = "error", "Error"


class RunLogLine(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="log_lines")
    created_at = models.DateTimeField(auto_now_add=True)
    level = models.CharField(max_length=10, choices=LogLevel.choices, default=LogLevel.INFO)
    message = models.TextField()
    # A launch warning Temper can act on: where (``{"url", "label"}``, ``core.warnings.ActionWarning``); {} for none.
    action = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]


class ArtifactKind(models.TextChoices):
    MODEL = "model", "Exported model"
    ADAPTER = "adapter", "LoRA adapter"
    CHECKPOINT = "checkpoint", "Exported checkpoint"


class Artifact(models.Model):
    """A directory a run produced (under its output_dir) that other runs or chats can use."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts")
    kind = models.CharField(max_length=20, choices=ArtifactKind.choices)
    path = models.CharField(max_length=1024, help_text="Absolute path of the directory.")
    # The step the directory holds: a ``checkpoint`` export's, or the run's last for its model and adapter
    # (``reporting.run_finish`` records them so, and a resume's export replaces them).
    step = models.PositiveIntegerField(default=0)
    size_bytes = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["kind", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "kind", "step"], name="artifact_unique_run_kind_step")]

    @property
    def folder_gone(self) -> bool:
        """Whether its directory was deleted since it was exported: the run page lists it as such, without its size,
        a download that would answer 404 (``artifacts.artifact_to_download``) or a launch that would be refused
        (``services.gone_model``)."""
        return not Path(self.path).is_dir()

    @property
    def has_model_card(self) -> bool:
        """Whether the engine wrote its model card (``README.md``) into it: exports written before cards were have
        none, and the run page offers no link to one."""
        return (Path(self.path) / MODEL_CARD_FILE).is_file()


class CheckpointExportStatus(models.TextChoices):
    EXPORTING = "exporting", "Exporting"
    EXPORTED = "exported", "Exported"
    FAILED = "failed", "Failed"


class CheckpointExport(models.Model):
    """Someone asked for checkpoint ``step`` of a finished run as a starting model, and how that went.
    The ``Artifact`` of kind ``checkpoint`` is the exported model itself; this row is what the run page
    shows while the train worker exports it, and the message when it failed."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoint_exports")
    step = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=CheckpointExportStatus.choices,
                              default=CheckpointExportStatus.EXPORTING)
    error_message = models.TextField(blank=True)
    notice = models.TextField(blank=True, default="", help_text=(
        "A word on the export under way that is no failure: that its worker was lost and it starts over "
        "(services.checkpoint_export_requeued). Its outcome clears it; error_message holds a failure."))
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["step"]
        constraints = [
            models.UniqueConstraint(fields=["run", "step"], name="checkpointexport_unique_run_step"),
            models.CheckConstraint(condition=models.Q(status__in=[status.value for status in CheckpointExportStatus]),
                                   name="checkpointexport_status_valid"),
        ]


class ServingCopyStatus(models.TextChoices):
    WRITING = "writing", "Being written"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


SERVING_COPY_SCHEMES = ("int8", "int4")  # jaxengine.quantize.SCHEMES


class ServingCopy(models.Model):
    """A quantized serving copy someone asked for, of an exported checkpoint (``run`` + ``step``), of a run's
    final model made again (``run``, no ``step``) or of a registered base model, and how writing it went.
    The copy itself is a directory (``webapp.runs.serving_copies.copy_dir``) that the chat serves once it
    is whole; this row is what the pages show meanwhile, what keeps a second request from queueing a
    second writer, and the reason when it failed. A run's final model gets its first copy when it
    succeeds, without a row; a row appears once someone makes it again (another scheme, after a failure)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="serving_copies")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, null=True, blank=True, related_name="serving_copies")
    step = models.PositiveIntegerField(null=True, blank=True)
    base_model = models.ForeignKey(BaseModel, on_delete=models.CASCADE, null=True, blank=True,
                                   related_name="serving_copies")
    # A base model has no eval set of its own: a ready dataset version of the project, when one was chosen.
    eval_version = models.ForeignKey(DatasetVersion, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    scheme = models.CharField(max_length=8, choices=[(name, name) for name in SERVING_COPY_SCHEMES], default="int8")
    status = models.CharField(max_length=10, choices=ServingCopyStatus.choices, default=ServingCopyStatus.WRITING)
    error_message = models.TextField(blank=True)
    notice = models.TextField(blank=True, default="", help_text=(
        "A word on the copy being written that is no failure: that its worker was lost and it starts over "
        "(serving_copies.serving_copy_requeued). Its outcome clears it; error_message holds a failure."))
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "step"], name="servingcopy_unique_run_step"),
            # NULLs are distinct in the constraint above: one row for a run's final model, too.
            models.UniqueConstraint(fields=["run"], condition=models.Q(step__isnull=True),
                                    name="servingcopy_unique_run_final"),
            models.UniqueConstraint(fields=["base_model"], name="servingcopy_unique_base_model"),
            models.CheckConstraint(
                condition=(models.Q(run__isnull=False, base_model__isnull=True)
                           | models.Q(run__isnull=True, step__isnull=True, base_model__isnull=False)),
                name="servingcopy_one_source"),
            models.CheckConstraint(condition=models.Q(status__in=[status.value for status in ServingCopyStatus]),
                                   name="servingcopy_status_valid"),
            models.CheckConstraint(condition=models.Q(scheme__in=SERVING_COPY_SCHEMES), name="servingcopy_scheme_valid"),
        ]


class ProjectCheckpointPrune(models.Model):
    """One project-wide prune asked for on the Storage page (``services.project_checkpoints_prune``) and how far it
    went: the task writes each run's outcome as it goes, so that the page can say "Pruning… N of M runs" while it
    runs and what it freed once it has finished. A row whose task stopped without finishing stops counting as
    running once ``updated_at`` is older than ``services.PRUNE_STALLED_AFTER``: a lost worker must not refuse
    every later prune."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="checkpoint_prunes")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    requested_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    runs_total = models.PositiveIntegerField(null=True, blank=True, help_text=(
        "The runs with checkpoints to weigh, counted when the task starts; null while it is queued."))
    runs_done = models.PositiveIntegerField(default=0)
    checkpoints_deleted = models.PositiveIntegerField(default=0)
    bytes_freed = models.PositiveBigIntegerField(default=0)
    failures = models.JSONField(default=list, blank=True, help_text=(
        'The runs it left, each {"run": public id, "name": its name, "why": the refusal or error}.'))

    class Meta:
        ordering = ["-requested_at", "-pk"]
