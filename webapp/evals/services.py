"""Writes of evaluations: create (checked whole before anything is saved), start, finish, fail, cancel, delete.

Callers check project access first (``get_project_for_user``; the member role to create, cancel and delete).
An evaluation is scored by the ``serve`` worker (``worker.tasks.evals``), as serving copies and review campaigns'
answers are: it is the worker the web app has load models on its behalf, sized for them, while ``default``
workers (dataset checks, housekeeping) need not hold a model's memory nor an accelerator, and ``train`` workers
are a run's alone.
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings as django_settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError

from jaxengine.data import formats
from jaxengine.evaluate import group_labels, reward_term_problems, unscorable_row
from jaxengine.rewards import WeightedReward
from jaxengine.words import with_article
from webapp.activity.models import Verb
from webapp.activity.services import activity_record
from webapp.celery import app as celery_app
from webapp.chat.selectors import ModelChoice, model_choice
from webapp.core.bidi import isolated
from webapp.datasets.models import DatasetVersion, VersionStatus
from webapp.evals import selectors
from webapp.evals.models import ACTIVE_EVALUATION_STATUSES, Evaluation, EvaluationStatus, Metric
from webapp.projects.models import Project
from webapp.projects.services import project_lock
from webapp.runs.models import Run
from webapp.webhooks import services as webhooks
from webapp.workers.deliveries import LostWorker, task_deliveries

logger = logging.getLogger(__name__)

EVALUATION_TASK = "worker.tasks.evals.run_evaluation"
EVALUATION_QUEUE = "serve"
MAX_ROWS = 5000
MAX_NEW_TOKENS = 1024
# What each dataset kind is scored by (``jaxengine.evaluate``): greedy completions against a prompts row's
# reference answer (its ``answer`` column unless the evaluation names another), or the mean loss of an sft row's
# completion. A prompts version may be scored by reward functions instead (``EvaluationSettings.reward_terms``).
METRIC_OF_KIND = {formats.DatasetKind.PROMPTS: Metric.EXACT_MATCH, formats.DatasetKind.SFT: Metric.LOSS}
ANSWER_COLUMN = "answer"


@dataclass(frozen=True, kw_only=True)
class EvaluationSettings:
    """How an evaluation reads and generates: the first ``row_limit`` rows; ``max_new_tokens`` per greedy
    completion (exact match, reward functions); ``group_by``: a column whose values each get their own figure (exact
    match, reward functions), "" for none; ``answer_column``: the column of reference answers (exact match), as
    ``jaxengine eval --answer-column``; ``reward_terms``: None to score a prompts version by exact match, or the
    reward functions to score it by instead, written as a GRPO spec's ``grpo.rewards`` (``jaxengine eval --metric
    rewards --rewards``), a ``reward_model``'s ``model`` a reward run's id."""

    row_limit: int = 200
    max_new_tokens: int = 32
    group_by: str = ""
    answer_column: str = ANSWER_COLUMN
    reward_terms: list[dict[str, Any]] | None = None

    def __post_init__(self):
        problems = {}
        if not 1 <= self.row_limit <= MAX_ROWS:
            problems["row_limit"] = f"rows must be 1 to {MAX_ROWS:,}, got {self.row_limit}"
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            problems["max_new_tokens"] = f"max new tokens must be 1 to {MAX_NEW_TOKENS}, got {self.max_new_tokens}"
        if len(self.group_by) > 100:
            problems["group_by"] = "the group-by column's name must be at most 100 characters"
        if not 1 <= len(self.answer_column) <= 100:
            problems["answer_column"] = (f"name the column of reference answers (1 to 100 characters; "
                                         f"'{ANSWER_COLUMN}' unless the version keeps them in another)")
        if problems:
            raise ValidationError(problems)


def _send(evaluation_id: int) -> None:
    try:
        celery_app.send_task(EVALUATION_TASK, args=[evaluation_id], queue=EVALUATION_QUEUE)
    except OperationalError:  # it stays queued; its page says so, and it can be cancelled
        logger.exception("could not queue evaluation %s: is Redis (REDIS_URL) up?", evaluation_id)


def version_rows(*, version: DatasetVersion, metric: str, row_limit: int,
                 answer_column: str = ANSWER_COLUMN) -> list[dict[str, Any]]:
    """The first ``row_limit`` rows of ``version`` as ``jaxengine.evaluate`` scores them: a prompts row with its
    reference (read from ``answer_column``) under ``answer``, an sft row as training reads it. A ``ValidationError``
    keyed ``dataset_version`` naming the file when it cannot be read, or ``answer_column`` naming the row whose
    reference is missing."""
    mapping = formats.ColumnMapping(kind=version.dataset.kind, columns=version.column_mapping)
    try:
        rows = list(itertools.islice(formats.iter_examples(
            version.absolute_path, fmt=formats.FileFormat(version.format), mapping=mapping), row_limit))
    except (OSError, formats.DatasetFormatError) as error:
        raise ValidationError({"dataset_version": f"{version} cannot be read: {error}"}) from None
    if not rows:
        raise ValidationError({"dataset_version": f"{version} has no rows to score"})
    if metric != Metric.EXACT_MATCH:
        if answer_column != ANSWER_COLUMN:
            raise ValidationError({"answer_column": (
                "an answer column is read for exact match (a prompts dataset) only; leave it "
                f"'{ANSWER_COLUMN}' " + ("(each reward function reads the column of its args.answer_column)"
                                         if metric == Metric.REWARDS else "for an sft dataset"))})
        return rows
    for number, row in enumerate(rows, 1):
        if not isinstance(row.get(answer_column), str):
            raise ValidationError({"answer_column": (
                f"row {number} of {version} has no '{answer_column}' text (its columns: {', '.join(sorted(row))}); "
                "exact match compares each greedy completion with the row's reference answer: name the column "
                "that holds them, or upload a version with that column")})
    return [{**row, ANSWER_COLUMN: row[answer_column]} for row in rows]


def _check_group_by(rows: list[dict[str, Any]], *, group_by: str, metric: str, version: DatasetVersion) -> None:
    if not group_by:
        return
    if metric == Metric.LOSS:
        raise ValidationError({"group_by": "groups are scored for exact match and reward functions (a prompts "
                                           "dataset) only; leave the group-by column empty for an sft dataset"})
    try:
        group_labels(rows, group_by, source=str(version))
    except ValueError as error:
        raise ValidationError({"group_by": str(error).removeprefix("data.eval_group_by: ")}) from None


def _checked_version(project: Project, version: DatasetVersion) -> str:
    """The metric ``version`` is scored by, or a ``ValidationError`` saying why it cannot be."""
    if version.dataset.project_id != project.pk:
        raise ValidationError({"dataset_version": "choose a dataset version of this project"})
    metric = METRIC_OF_KIND.get(version.dataset.kind)
    if metric is None:
        raise ValidationError({"dataset_version": (
            f"{version} is {with_article(version.dataset.kind)} dataset; evaluations score a prompts dataset with "
            "an 'answer' column (exact match) or an sft dataset (loss)")})
    if version.status == VersionStatus.FAILED:  # it never becomes ready: its problems are fixed in a new version
        raise ValidationError({"dataset_version": (
            f"{version} {version.status_phrase}; it will not be scored: upload the file corrected as a new version "
            f"of {version.dataset.name} and evaluate on that")})
    if version.status != VersionStatus.READY:
        raise ValidationError({"dataset_version": f"{version} {version.status_phrase}; choose it once it is ready"})
    return metric


def scoring_terms(*, project: Project, written: Any, rows: list[dict[str, Any]], version: DatasetVersion
                  ) -> tuple[list[dict[str, Any]], list[WeightedReward]]:
    """The reward terms ``written`` as a GRPO spec's ``grpo.rewards`` (an evaluation's ``reward_terms``), checked
    as a launch checks that list: registered functions with fitting arguments (``reward_term_problems``, the spec's
    own check), a ``reward_model``'s ``model`` a succeeded reward run of ``project``, each term able to score every
    row of ``rows`` (its reference column there). Returns (the terms as stored: name, weight, args each, so that
    two evaluations of the same terms compare equal however they were written; the terms to score with, a
    ``reward_model``'s ``model`` its run's exported model). A ``ValidationError`` keyed ``reward_terms`` or
    ``reward_terms.<n>.<key>`` (where the launch page's reward rows show errors) otherwise. Checked again when the
    worker scores: a reward run may be gone by then."""
    from webapp.runs.services import reward_run_path

    terms, problems = reward_term_problems(written)
    if problems:
        raise ValidationError({f"reward_terms.{key}" if key else "reward_terms": message
                               for key, message in problems.items()})
    resolved = []
    for index, term in enumerate(terms):
        if term.name == "reward_model":  # a model read from disk: only a reward run of this project may be named
            path = reward_run_path(project=project, reference=term.args["model"],
                                   key=f"reward_terms.{index}.args.model")
            term = WeightedReward(name=term.name, weight=term.weight, args={**term.args, "model": path})
        elif problem := unscorable_row([term], rows):
            raise ValidationError({f"reward_terms.{index}.args.answer_column": f"{version}: {problem}"})
        resolved.append(term)
    return [{"name": term.name, "weight": term.weight, "args": dict(term.args or {})} for term in terms], resolved


def version_refusal(*, project: Project, public_id: str) -> str:
    """Why the dataset version ``public_id`` cannot be evaluated in ``project``, in ``evaluation_create``'s words, or
    "" where it can: for a link (the New evaluation page's ``?version=``) naming one the form does not offer, which
    would otherwise leave another version chosen without a word."""
    version = DatasetVersion.objects.select_related("dataset").filter(dataset__project=project,
                                                                      public_id=public_id).first()
    if version is None:
        return f"{public_id!r} is not a dataset version of this project"
    try:
        _checked_version(project, version)
    except ValidationError as error:
        return " ".join(error.messages)
    return ""


@dataclass(frozen=True, kw_only=True)
class _Scoring:
    """What ``settings`` score ``version`` by, checked: the metric and the reward terms as stored."""

    metric: str
    reward_terms: list[dict[str, Any]]


def _checked_scoring(*, project: Project, version: DatasetVersion, settings: EvaluationSettings) -> _Scoring:
    """Everything about an evaluation but its model, checked before a row is saved (the version, the rows read, the
    reward terms, the group-by column's values); a ``ValidationError`` names the field."""
    metric = _checked_version(project, version)
    if settings.reward_terms is not None:
        if metric != Metric.EXACT_MATCH:
            raise ValidationError({"reward_terms": (
                f"{version} is an sft dataset, scored by loss; reward functions score the greedy completions of a "
                "prompts dataset: choose one, or leave the reward functions out")})
        metric = Metric.REWARDS
    rows = version_rows(version=version, metric=metric, row_limit=settings.row_limit,
                        answer_column=settings.answer_column)
    stored_terms = []
    if metric == Metric.REWARDS:
        stored_terms, _scored = scoring_terms(project=project, written=settings.reward_terms, rows=rows,
                                              version=version)
    _check_group_by(rows, group_by=settings.group_by, metric=metric, version=version)
    return _Scoring(metric=metric, reward_terms=stored_terms)


def _unsaved(*, project: Project, choice: ModelChoice, version: DatasetVersion, settings: EvaluationSettings,
             scoring: _Scoring, user: AbstractBaseUser | None) -> Evaluation:
    return Evaluation(project=project, model_ref=choice.ref, model_label=choice.label, dataset_version=version,
                      version_label=str(version), metric=scoring.metric, row_limit=settings.row_limit,
                      max_new_tokens=settings.max_new_tokens, group_by=settings.group_by,
                      answer_column=settings.answer_column, reward_terms=scoring.reward_terms, created_by=user)


def _queue(evaluation: Evaluation, *, user: AbstractBaseUser | None) -> Evaluation:
    evaluation.save()
    activity_record(project=evaluation.project, actor=user, verb=Verb.EVALUATION_LAUNCHED, target=evaluation,
                    details={"metric": evaluation.metric})
    transaction.on_commit(lambda: _send(evaluation.pk))
    return evaluation


@transaction.atomic
def evaluation_create(*, project: Project, model_ref: str, version: DatasetVersion, settings: EvaluationSettings,
                      user: AbstractBaseUser | None) -> Evaluation:
    """Queue the scoring of the model ``model_ref`` (as the chat's model picker names it: a base model, a succeeded
    run's model, an exported checkpoint; its serving copy where it has one, as the chat serves it) on the first
    rows of ``version``: exact match of greedy completions for a prompts version, mean completion loss for an sft
    one. Everything is checked first (the rows read, the group-by column's values), and a ``ValidationError``
    names the field; the ``serve`` worker is sent it once the row is committed."""
    project_lock(project=project, doing="as the evaluation was being created")
    choice = model_choice(project=project, ref=model_ref)
    if choice is None:
        raise ValidationError({"model": f"{model_ref!r} is not a model of {project.slug}: choose a base model, a "
                                        "succeeded run or an exported checkpoint"})
    if choice.refused:
        raise ValidationError({"model": choice.refused})
    scoring = _checked_scoring(project=project, version=version, settings=settings)
    return _queue(_unsaved(project=project, choice=choice, version=version, settings=settings, scoring=scoring,
                           user=user), user=user)


# At most this many evaluations queued by one press of "every checkpoint of a run": each loads a model on a serve
# worker, whose queue the chat shares. A run with more models has the rest queued by the next press (the ones
# queued by this one are skipped then, as evaluated already).
MAX_RUN_EVALUATIONS = 20


@dataclass(frozen=True, kw_only=True)
class RunEvaluations:
    """What ``evaluations_create_for_run`` did: the evaluations queued (step order); the models skipped as evaluated
    already (their refs); those left for another press past ``MAX_RUN_EVALUATIONS`` (their refs); the steps of the
    run's checkpoints not exported, which no evaluation can score."""

    created: list[Evaluation]
    skipped: list[str]
    left: list[str]
    not_exported: list[int]


def spread(items: list, count: int) -> list:
    """``count`` of ``items`` spread evenly over them, the first and the last among them (all where there are no more
    than ``count``), in their order: a curve's shape first, its points filled in later."""
    if len(items) <= count:
        return list(items)
    if count == 1:
        return [items[-1]]
    return [items[round(index * (len(items) - 1) / (count - 1))] for index in range(count)]


@transaction.atomic
def evaluations_create_for_run(*, project: Project, run: Run, version: DatasetVersion, settings: EvaluationSettings,
                               user: AbstractBaseUser | None) -> RunEvaluations:
    """Queue the scoring of every model of ``run`` that can be served (its exported checkpoints and its final model,
    ``selectors.run_model_choices``) on ``version`` with the same ``settings``, for the run page's curve across
    checkpoints. All or nothing: everything is checked (as ``evaluation_create`` checks one, each model too) before
    a row is saved, and a ``ValidationError`` names the field. A model with a succeeded, queued or running
    evaluation of the same figure (``selectors.comparison_key``) is skipped; at most ``MAX_RUN_EVALUATIONS`` are
    queued, spread over the run's steps."""
    project_lock(project=project, doing="as the run's evaluations were being created")
    choices = selectors.run_model_choices(project=project, run=run)
    not_exported = selectors.unexported_checkpoints(run=run)
    if not choices:
        raise ValidationError({"model": (
            f"run {run.public_id} ({isolated(run.name)}) has no model to evaluate: "
            + ("export its checkpoints on the run's page (Checkpoints) first" if not_exported
               else "a run's final model is evaluated once it succeeds, its checkpoints once they are exported"))})
    for choice in choices:
        if choice.refused:  # it names the model
            raise ValidationError({"model": choice.refused})
    scoring = _checked_scoring(project=project, version=version, settings=settings)
    wanted = [_unsaved(project=project, choice=choice, version=version, settings=settings, scoring=scoring, user=user)
              for choice in choices]
    done = {(selectors.comparison_key(evaluation), evaluation.model_ref) for evaluation in
            Evaluation.objects.filter(project=project, model_ref__in=[choice.ref for choice in choices],
                                      status__in=(EvaluationStatus.SUCCEEDED, *ACTIVE_EVALUATION_STATUSES))}
    skipped = [evaluation.model_ref for evaluation in wanted
               if (selectors.comparison_key(evaluation), evaluation.model_ref) in done]
    to_queue = [evaluation for evaluation in wanted if evaluation.model_ref not in skipped]
    queued = spread(to_queue, MAX_RUN_EVALUATIONS)
    queued_refs = {evaluation.model_ref for evaluation in queued}
    left = [evaluation.model_ref for evaluation in to_queue if evaluation.model_ref not in queued_refs]
    return RunEvaluations(created=[_queue(evaluation, user=user) for evaluation in queued], skipped=skipped,
                          left=left, not_exported=not_exported)


def evaluation_start(*, evaluation_id: int) -> Evaluation | None:
    """The serve worker takes up a queued evaluation, or a running one whose message was queued again because the
    worker scoring it died (``workers.deliveries.deliveries_restore_orphaned``): running from now. None when it has
    ended (cancelled, or deleted, before its message was taken up)."""
    if not Evaluation.objects.filter(pk=evaluation_id, status__in=ACTIVE_EVALUATION_STATUSES).update(
            status=EvaluationStatus.RUNNING, started_at=timezone.now(), rows_done=0, rows_total=0):
        return None  # (a lost worker's evaluation starts over: its rows are counted anew)
    return Evaluation.objects.select_related("project", "dataset_version__dataset").get(pk=evaluation_id)


def evaluation_progress(*, evaluation_id: int, rows_done: int, rows_total: int) -> bool:
    """Record a running evaluation's rows generated so far (its page says "Scoring: 128 of 500 rows"); whether it
    is still running, which the worker asks after each slice of rows: False once it was cancelled or deleted, and
    the worker stops generating."""
    return Evaluation.objects.filter(pk=evaluation_id, status=EvaluationStatus.RUNNING).update(
        rows_done=rows_done, rows_total=rows_total) > 0


@transaction.atomic
def evaluation_finish(*, evaluation_id: int, result: dict[str, Any]) -> bool:
    """Record a running evaluation's result (``jaxengine.evaluate``'s object) and tell the project's
    ``evaluation.succeeded`` webhooks. Whether it was recorded: not for one cancelled or deleted meanwhile, nor
    twice."""
    recorded = Evaluation.objects.filter(pk=evaluation_id, status=EvaluationStatus.RUNNING).update(
        status=EvaluationStatus.SUCCEEDED, result=result, notice="", finished_at=timezone.now()) > 0
    if recorded:
        _tell_webhooks(evaluation_id)
    return recorded


@transaction.atomic
def evaluation_fail(*, evaluation_id: int, reason: str) -> bool:
    """A running evaluation could not be scored: it fails with ``reason`` (shown on its page), and the project's
    ``evaluation.failed`` webhooks are told. Whether it failed here (not one that had ended already)."""
    updated = Evaluation.objects.filter(pk=evaluation_id, status=EvaluationStatus.RUNNING).update(
        status=EvaluationStatus.FAILED, error=reason, notice="", finished_at=timezone.now())
    if updated:
        logger.warning("evaluation %s failed: %s", evaluation_id, reason)
        _tell_webhooks(evaluation_id)
    return updated > 0


def _tell_webhooks(evaluation_id: int) -> None:
    # Recorded in the transaction that ended it: only the update that changed the row gets here, so once per end.
    webhooks.evaluation_ended(evaluation=Evaluation.objects.select_related("project", "dataset_version")
                              .get(pk=evaluation_id))


def evaluation_requeued(arguments: tuple, *, lost: LostWorker) -> bool:
    """Say on an evaluation under way that its serve worker was lost and it was queued again
    (``workers.deliveries.FIRST_LOSS_NOTES``), in its ``notice``; its outcome clears it. Whether it was said (not for
    one that ended meanwhile)."""
    (evaluation_id,) = arguments
    return Evaluation.objects.filter(pk=evaluation_id, status__in=ACTIVE_EVALUATION_STATUSES).update(
        notice=lost.note(doing="scoring this evaluation", work="the scoring")) > 0


WORKERS_LOST = ("scoring it stopped two serve workers in turn (killed, out of memory, or their host lost); it is not "
                "scored again: evaluate on fewer rows, with fewer new tokens or a smaller model, or ask for serve "
                "workers with more memory")


def evaluations_fail_abandoned(*, now: datetime | None = None) -> list[int]:
    """Fail each running evaluation whose message lost two serve workers in turn (run by every worker's reaper,
    ``worker/reaper.py``): a dead worker's message is queued again once (``deliveries_restore_orphaned``), and one
    that kills its next worker too (out of memory) would be left to Celery's visibility timeout, an hour, the
    evaluation saying meanwhile that it runs and holding its model. Returns the ids failed."""
    now = now or timezone.now()
    running = list(Evaluation.objects.filter(status=EvaluationStatus.RUNNING).values_list("pk", flat=True))
    if not running or (deliveries := task_deliveries(task=EVALUATION_TASK, now=now)) is None:
        return []
    abandoned = deliveries.abandoned(delivered_before=now - timedelta(seconds=django_settings.TEMPER_RUN_LOST_SECONDS))
    return [evaluation_id for evaluation_id in running
            if (evaluation_id,) in abandoned and evaluation_fail(evaluation_id=evaluation_id, reason=WORKERS_LOST)]


@transaction.atomic
def evaluation_cancel(*, evaluation: Evaluation, user: AbstractBaseUser) -> Evaluation:
    """Stop a queued or running evaluation: cancelled at once; a message still queued then does nothing, a worker
    generating its completions stops after the slice of rows under way (``evaluation_progress`` says so), and one
    scoring a loss has its result dropped (``evaluation_finish``). Refused once it has ended."""
    evaluation = Evaluation.objects.select_for_update(of=("self",)).get(pk=evaluation.pk)
    if evaluation.status not in ACTIVE_EVALUATION_STATUSES:
        raise ValidationError({"status": f"evaluation {evaluation.public_id} is {evaluation.status}: there is "
                                         "nothing to cancel"})
    evaluation.status = EvaluationStatus.CANCELLED
    evaluation.error = f"{isolated(user.get_username())} cancelled it"
    evaluation.finished_at = timezone.now()
    evaluation.save(update_fields=["status", "error", "finished_at"])
    activity_record(project=evaluation.project, actor=user, verb=Verb.EVALUATION_CANCELLED, target=evaluation)
    return evaluation


@transaction.atomic
def evaluation_delete(*, evaluation: Evaluation, user: AbstractBaseUser) -> None:
    """Delete an evaluation that has ended (a queued or running one is cancelled first, so that its worker's
    result never lands on nothing)."""
    evaluation = Evaluation.objects.select_for_update(of=("self",)).get(pk=evaluation.pk)
    if evaluation.status in ACTIVE_EVALUATION_STATUSES:
        raise ValidationError({"delete": f"evaluation {evaluation.public_id} is {evaluation.status}; cancel it "
                                         "first"})
    activity_record(project=evaluation.project, actor=user, verb=Verb.EVALUATION_DELETED, target=evaluation)
    evaluation.delete()
