"""Evaluations: one model of a project scored on one dataset version by ``jaxengine.evaluate``.

Design note. An evaluation copies what it needs to be read later (the model's label and reference, the
version's label, the metric, the settings) so that its result still reads once the model or the version is
deleted: a version deleted after the evaluation leaves ``dataset_version`` empty and ``version_label`` behind.
Models compared on "the same data" are those scored on the same version, by the same metric, on the same first
``row_limit`` rows, and for reward functions by the same terms (``selectors.comparison_tables``).
"""
from __future__ import annotations

from django.conf import settings
from django.db import models

from webapp.core.ids import PUBLIC_ID_MAX_LENGTH, new_public_id
from webapp.core.model_refs import BASE_MODEL_LABEL, RUN_LABEL
from webapp.datasets.models import DatasetVersion
from webapp.projects.models import Project


def new_evaluation_id() -> str:
    return new_public_id("ev")


class EvaluationStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


ACTIVE_EVALUATION_STATUSES = (EvaluationStatus.QUEUED, EvaluationStatus.RUNNING)


class Metric(models.TextChoices):
    EXACT_MATCH = "exact_match", "exact match"
    LOSS = "loss", "loss"
    REWARDS = "rewards", "reward functions"


# The kinds a stored model label starts with (webapp.chat.selectors labels its models so).
MODEL_LABEL_KINDS = (RUN_LABEL, BASE_MODEL_LABEL)


class Evaluation(models.Model):
    public_id = models.CharField(max_length=PUBLIC_ID_MAX_LENGTH, unique=True, default=new_evaluation_id)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="evaluations")
    # The chat's model reference (``webapp.chat.selectors.model_choice``): bm_…, run_… or run_…:<step>.
    model_ref = models.CharField(max_length=200)
    model_label = models.CharField(max_length=300)
    dataset_version = models.ForeignKey(DatasetVersion, on_delete=models.SET_NULL, null=True, blank=True,
                                        related_name="evaluations")
    version_label = models.CharField(max_length=300)
    metric = models.CharField(max_length=20, choices=Metric.choices)
    row_limit = models.PositiveIntegerField()
    max_new_tokens = models.PositiveIntegerField()
    group_by = models.CharField(max_length=100, blank=True, default="")
    # Exact match: the column holding each row's reference answer (``jaxengine eval --answer-column``).
    answer_column = models.CharField(max_length=100, default="answer")
    # Reward functions: the terms, as a GRPO spec's ``grpo.rewards`` (``[{name, weight, args}]``, checked as it is;
    # a ``reward_model``'s ``args.model`` a reward run's id). Compared only with evaluations of the same terms.
    reward_terms = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=12, choices=EvaluationStatus.choices, default=EvaluationStatus.QUEUED)
    # ``jaxengine.evaluate``'s object: metric, value, count, groups (with group_by), examples; terms (rewards).
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")
    # A word on a scoring under way that is no failure: its serve worker was lost and it starts over
    # (``services.evaluation_requeued``). Its outcome clears it; ``error`` holds failures.
    notice = models.TextField(blank=True, default="")
    # Progress while it runs, kept beside ``result`` rather than in it: ``result`` is ``jaxengine.evaluate``'s object
    # whole or nothing ({} until it succeeds), which the API, comparisons and webhooks read as the figure. The worker
    # sets both after each slice of rows generated (``services.evaluation_progress``); 0 of 0 before its first.
    rows_done = models.PositiveIntegerField(default=0)
    rows_total = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["project", "-created_at"], name="evaluation_newest")]

    def __str__(self) -> str:
        return f"{self.model_label} on {self.version_label}"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_EVALUATION_STATUSES

    @property
    def model_name(self) -> str:
        """``model_label`` without the kind it starts with ("Run: ", "Base model: ", as the chat's pickers label
        models), which ``model_kind`` says in words: "Evaluation of Run: arith lora eval" read awkwardly."""
        for kind in MODEL_LABEL_KINDS:
            if self.model_label.startswith(kind):
                return self.model_label[len(kind):]
        return self.model_label

    @property
    def model_kind(self) -> str:
        """What kind of model was scored, from its reference (``chat.selectors``'s: ``bm_…``, ``run_…``,
        ``run_…:step-N``), which stays as it was when the model is gone."""
        if self.model_ref.startswith("bm_"):
            return "A base model"
        if self.model_ref.startswith("run_"):
            return "A checkpoint of a run" if ":step-" in self.model_ref else "The model exported by a run"
        return "A model"


    @property
    def model_id(self) -> str:
        """The id of the evaluated model: a base model's, or the run's for its model or one of its checkpoints."""
        return self.model_ref.split(":")[0]

    @property
    def value(self) -> float | None:
        """The figure of a succeeded evaluation: its result's ``value``, or ``result_value`` where a selector read
        that alone in place of the whole result (``selectors.run_page_evaluations``)."""
        if self.status != EvaluationStatus.SUCCEEDED:
            return None
        return self.result_value if hasattr(self, "result_value") else self.result.get("value")
