"""Reads of evaluations: the project's list, one by id, the side-by-side comparison, a run's scores across its
checkpoints, and the evaluations a deletion of a model or a dataset version must wait for."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.db.models.fields.json import KeyTransform
from django.http import Http404
from django.urls import reverse

from webapp.basemodels.models import BaseModel
from webapp.chat.selectors import ModelChoice, model_choices
from webapp.core.bidi import isolated
from webapp.core.keyset import KeysetPage, keyset_page
from webapp.core.model_refs import checkpoint_of
from webapp.datasets.models import DatasetVersion
from webapp.evals.models import ACTIVE_EVALUATION_STATUSES, Evaluation, EvaluationStatus, Metric
from webapp.projects.models import Membership, Project, Role
from webapp.runs.models import ArtifactKind, Run
from webapp.runs.services import checkpoint_steps, final_model_step


def evaluation_list(*, project: Project, model_id: str = "") -> QuerySet[Evaluation]:
    """The project's evaluations, newest first; with ``model_id`` (a base model's id, or a run's, which covers its
    checkpoints), that model's alone."""
    evaluations = Evaluation.objects.filter(project=project)
    if model_id:
        evaluations = evaluations.filter(_of_model(model_id))
    return evaluations.select_related("created_by", "dataset_version__dataset").order_by("-created_at", "-id")


def run_page_evaluations(*, project: Project, run_id: str) -> list[Evaluation]:
    """``evaluation_list`` of the run ``run_id`` (its checkpoints' too) as its page's table and curves read them:
    without each stored ``result`` (the first completions are kept as examples, kilobytes each, and a run evaluated at
    every checkpoint has hundreds), its ``value`` read in the database instead (``Evaluation.value`` reads it)."""
    return list(Evaluation.objects.filter(project=project).filter(_of_model(run_id)).defer("result")
                .annotate(result_value=KeyTransform("value", "result")).order_by("-created_at", "-id"))


@dataclass(frozen=True, kw_only=True)
class ModelEvaluations:
    """The newest evaluations of one model (``newest``, at most a handful) and how many there are in all."""

    newest: list[Evaluation]
    count: int


def model_evaluations(*, evaluations: list[Evaluation], limit: int = 5) -> ModelEvaluations:
    """The ``limit`` newest of one model's ``evaluations`` (``evaluation_list``'s, newest first), for its page."""
    return ModelEvaluations(newest=evaluations[:limit], count=len(evaluations))


def _of_model(model_id: str) -> Q:
    # A model reference is the model's id, or a run's id and a checkpoint after a colon (chat.selectors.model_choice).
    return Q(model_ref=model_id) | Q(model_ref__startswith=f"{model_id}:")


def comparisons_with(tables: list[Comparison], *, model_id: str) -> list[Comparison]:
    """The side-by-side tables in which the model ``model_id`` (as ``evaluation_list``'s) stands."""
    return [table for table in tables
            if any(evaluation.model_id == model_id for evaluation in table.evaluations)]


def evaluation_page(*, project: Project, after: tuple[str, int] | None, limit: int,
                    model_id: str = "") -> KeysetPage[Evaluation]:
    """The ``limit`` evaluations of ``evaluation_list`` (newest first; with ``model_id``, that model's) after the one
    whose (creation time as ISO text, id) is ``after`` (``webapp.core.keyset``)."""
    evaluations = evaluation_list(project=project, model_id=model_id)
    if after is not None:
        created_at, last_id = after
        evaluations = evaluations.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=last_id))
    return keyset_page(evaluations, limit=limit, key=lambda evaluation: (evaluation.created_at.isoformat(),
                                                                         evaluation.pk))


def model_reward_terms(*, project: Project, model_ref: str) -> list[dict[str, Any]]:
    """The reward functions the GRPO or PPO run ``model_ref`` (its model or a checkpoint) evaluated and trained with,
    as its spec writes them (``eval_metrics``, then ``rewards``; PPO's ``reward_model`` as a ``reward_model``
    function): what the New evaluation page fills in to score other models as that run was. [] for another model."""
    run = Run.objects.filter(project=project, public_id=model_ref.split(":")[0],
                             task__in=("grpo", "ppo")).only("task", "spec").first()
    section = run.spec.get(run.task) if run is not None and isinstance(run.spec, dict) else None
    if not isinstance(section, dict):
        return []
    terms = [*(section.get("eval_metrics") or ()), *(section.get("rewards") or ())]
    if run.task == "ppo" and section.get("reward_model"):
        terms.append({"name": "reward_model", "args": {"model": section["reward_model"]}})
    return [term for term in terms if isinstance(term, dict)]


def evaluation_reward_terms(*, project: Project, public_id: str) -> list[dict[str, Any]]:
    """The reward functions of the evaluation ``public_id`` of ``project`` ([] for none, or for no such evaluation)."""
    if not public_id:
        return []
    return (Evaluation.objects.filter(project=project, public_id=public_id)
            .values_list("reward_terms", flat=True).first()) or []


def evaluation_get(*, project: Project, public_id: str) -> Evaluation:
    """The evaluation ``public_id`` of ``project``; 404 for one of another project, as for none."""
    evaluation = (Evaluation.objects.select_related("project", "created_by", "dataset_version__dataset")
                  .filter(project=project, public_id=public_id).first())
    if evaluation is None:
        raise Http404("no such evaluation")
    return evaluation


def evaluations_by_ids(*, project: Project, public_ids: list[str]) -> list[Evaluation]:
    """The evaluations ``public_ids`` of ``project`` in that order, those deleted since left out."""
    found = {evaluation.public_id: evaluation for evaluation in
             Evaluation.objects.select_related("project", "created_by", "dataset_version__dataset")
             .filter(project=project, public_id__in=public_ids)}
    return [found[public_id] for public_id in public_ids if public_id in found]


def model_page(*, evaluation: Evaluation) -> str:
    """The page of the evaluation's model (a base model's, or the run's for its model or a checkpoint), "" once the
    model has been deleted (its label is what is left)."""
    model_id = evaluation.model_id
    if model_id.startswith("bm_") and BaseModel.objects.filter(project_id=evaluation.project_id,
                                                               public_id=model_id).exists():
        return reverse("basemodels:detail", args=[evaluation.project.slug, model_id])
    if Run.objects.filter(project_id=evaluation.project_id, public_id=model_id).exists():
        return reverse("runs:detail", args=[evaluation.project.slug, model_id])
    return ""


def may_delete_evaluation(*, membership: Membership, evaluation: Evaluation) -> bool:
    """As a run: an owner may delete any evaluation, a member one they launched, a viewer none."""
    return membership.can(Role.OWNER) or (membership.can(Role.MEMBER)
                                          and evaluation.created_by_id == membership.user_id)


def ensure_may_delete_evaluation(*, membership: Membership, evaluation: Evaluation) -> None:
    """``PermissionDenied`` saying who may, unless ``membership`` may delete ``evaluation`` (pages and API)."""
    if not may_delete_evaluation(membership=membership, evaluation=evaluation):
        raise PermissionDenied("only an owner, or the member who launched it, may delete an evaluation")


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """The succeeded evaluations on the same rows of one version by one metric (for reward functions, by the same
    terms), best first: exact match and a reward total highest first, loss lowest first. Only the newest of each
    model is shown (an evaluation made again supersedes)."""

    version_label: str
    metric: str
    row_limit: int
    # The version's rows, where it still exists: a limit past them read it whole (``rows_label``).
    version_rows: int | None = None
    # Per completion, for a generating metric (``generation_settings``); None for loss.
    max_new_tokens: int | None = None
    reward_terms: list[dict[str, Any]] = field(default_factory=list)
    evaluations: list[Evaluation] = field(default_factory=list)

    @property
    def metric_label(self) -> str:
        return Metric(self.metric).label

    @property
    def higher_is_better(self) -> bool:
        return self.metric != Metric.LOSS

    @property
    def rows_label(self) -> str:
        return rows_label(row_limit=self.row_limit, version_rows=self.version_rows)

    @property
    def terms_label(self) -> str:
        return terms_label(self.reward_terms)


def rows_label(*, row_limit: int, version_rows: int | None) -> str:
    """The rows an evaluation reads, as its pages name them: "the first 200 rows", or "all 10 rows" where the version
    holds no more than the limit (the form's default of 200 over a 10-row held-out set read as if 190 were missing).
    ``version_rows`` is None once the version is deleted: the limit is all that is known."""
    if version_rows is not None and version_rows <= row_limit:
        return f"all {version_rows:,} row{'s' if version_rows != 1 else ''}"
    return f"the first {row_limit:,} rows"


def evaluation_rows_label(evaluation: Evaluation) -> str:
    """``rows_label`` of one evaluation."""
    version = evaluation.dataset_version
    return rows_label(row_limit=evaluation.row_limit, version_rows=version.row_count if version else None)


def terms_label(terms: list[dict[str, Any]]) -> str:
    """Reward terms in a line (``contains × 2 {"keywords": ["4"]}; numeric_match``; arguments sorted by name, whatever
    order the database keeps them in), "" for none."""
    return "; ".join(name + (f" × {weight:g}" if weight != 1 else "") + (f" {args}" if args else "")
                     for name, weight, args in _terms_text(terms))


def comparison_key(evaluation: Evaluation) -> tuple:
    """What makes two evaluations' figures comparable: the same version (its label once it is deleted), metric, rows
    read, reward terms (names, weights and arguments: a total of other terms, or of the same weighted otherwise, is
    another figure) and ``generation_settings``. The side-by-side tables, the run page's curves and
    ``evaluations_create_for_run``'s "evaluated already" all group by it; an evaluation not yet saved has one too."""
    return (evaluation.dataset_version_id or evaluation.version_label, evaluation.metric, evaluation.row_limit,
            json.dumps(evaluation.reward_terms, sort_keys=True), generation_settings(evaluation))


def generation_settings(evaluation: Evaluation) -> tuple:
    """The settings that change a generating metric's figure: the new-token budget (a completion cut shorter may
    lose its answer) and, for exact match, the column of answers it is held against (a reward term names its own,
    in its arguments). Loss generates nothing: none."""
    if evaluation.metric == Metric.LOSS:
        return ()
    if evaluation.metric == Metric.EXACT_MATCH:
        return (evaluation.max_new_tokens, evaluation.answer_column)
    return (evaluation.max_new_tokens,)


def comparison_tables(*, evaluations: list[Evaluation]) -> list[Comparison]:
    """``evaluations`` (newest first) grouped so that models scored on the same data stand side by side
    (``comparison_key``). Tables in the order of their newest evaluation."""
    tables: dict[tuple, Comparison] = {}
    seen: set[tuple] = set()
    for evaluation in evaluations:
        if evaluation.status != EvaluationStatus.SUCCEEDED:
            continue
        key = comparison_key(evaluation)
        if (key, evaluation.model_ref) in seen:
            continue
        seen.add((key, evaluation.model_ref))
        table = tables.setdefault(key, Comparison(version_label=evaluation.version_label, metric=evaluation.metric,
                                                  row_limit=evaluation.row_limit,
                                                  version_rows=(evaluation.dataset_version.row_count
                                                                if evaluation.dataset_version else None),
                                                  max_new_tokens=(evaluation.max_new_tokens
                                                                  if generation_settings(evaluation) else None),
                                                  reward_terms=evaluation.reward_terms))
        table.evaluations.append(evaluation)
    for table in tables.values():
        table.evaluations.sort(key=lambda evaluation: evaluation.result["value"], reverse=table.higher_is_better)
    return list(tables.values())


def model_step(model_ref: str, *, final_step: int) -> int:
    """The training step of a run's model named as an evaluation names it: a checkpoint's own (``run_…:step-N``),
    ``final_step`` (the run's last) for its final model."""
    checkpoint = checkpoint_of(model_ref)
    return int(checkpoint[1]) if checkpoint is not None else final_step


def run_model_choices(*, project: Project, run: Run) -> list[ModelChoice]:
    """The models of ``run`` an evaluation can score, as the chat serves them (``model_choices``; an archived run's
    too): its exported checkpoints in step order, then its final model (a succeeded run's)."""
    own = [choice for choice in model_choices(project=project, archived=True)
           if choice.ref.split(":")[0] == run.public_id]
    return sorted(own, key=lambda choice: (model_step(choice.ref, final_step=run.current_step),
                                           checkpoint_of(choice.ref) is None))


def unexported_checkpoints(*, run: Run) -> list[int]:
    """The steps of ``run``'s training checkpoints that are not exported (the final model's aside, which is): no
    worker serves them, so no evaluation scores them until they are exported (the run page's Checkpoints). None of
    an active run: its checkpoints are exported once it has ended."""
    if run.is_active:
        return []
    exported = set(run.artifacts.filter(kind=ArtifactKind.CHECKPOINT).values_list("step", flat=True))
    final = final_model_step(run)
    return [step for step in checkpoint_steps(run) if step not in exported and step != final]


def evaluation_curves(*, evaluations: list[Evaluation], run_id: str, final_step: int) -> list[dict[str, Any]]:
    """How held-out scores moved across the run ``run_id``'s checkpoints, for its page's chart: of ``evaluations``
    (newest first, as ``evaluation_list`` gives them), the succeeded ones of the run's models, one curve per
    ``comparison_key`` (the same figure, comparable from point to point). A curve's points are the newest
    evaluation of each model at its step (``model_step``: the final model at ``final_step``), in step order, the best
    marked ``best`` (exact match and a reward total highest, loss lowest; the earliest step of equals). Curves in the
    order of their newest evaluation; JSON-ready (the page reads them through json_script)."""
    curves: dict[tuple, dict[str, Any]] = {}
    seen: set[tuple] = set()
    for evaluation in evaluations:
        value = evaluation.value
        if evaluation.model_id != run_id or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        key = comparison_key(evaluation)
        if (key, evaluation.model_ref) in seen:  # an older evaluation of the same model: the newer one stands
            continue
        seen.add((key, evaluation.model_ref))
        curve = curves.setdefault(key, {
            "name": _curve_name(evaluation), "metric": evaluation.metric,
            "higher_is_better": evaluation.metric != Metric.LOSS, "points": []})
        curve["points"].append({"step": model_step(evaluation.model_ref, final_step=final_step), "value": value,
                                "model": evaluation.model_label, "evaluation": evaluation.public_id, "best": False})
    for curve in curves.values():
        curve["points"].sort(key=lambda point: point["step"])
        sign = 1 if curve["higher_is_better"] else -1
        best = max(curve["points"], key=lambda point: (sign * point["value"], -point["step"]))
        best["best"] = True
    return list(curves.values())


def _curve_name(evaluation: Evaluation) -> str:
    terms = terms_label(evaluation.reward_terms)
    tokens = f" · ≤{evaluation.max_new_tokens} new tokens" if generation_settings(evaluation) else ""
    return (f"{evaluation.version_label} · {Metric(evaluation.metric).label} · {evaluation.row_limit:,} rows{tokens}"
            + (f" · {terms}" if terms else ""))


def group_rows(evaluation: Evaluation) -> list[tuple[str, float, int, list[float | None]]]:
    """``(group, value, count, each term's mean in ``term_rows``' order)`` of a succeeded evaluation grouped by a
    column, groups sorted (no term means but for reward functions)."""
    groups = evaluation.result.get("groups") or {}
    names = [row[0] for row in term_rows(evaluation)]
    return [(name, group["value"], group["count"], [(group.get("terms") or {}).get(term) for term in names])
            for name, group in sorted(groups.items())]


def term_rows(evaluation: Evaluation) -> list[tuple[str, float, str, float | None]]:
    """``(function, weight, its arguments as JSON text or "", mean)`` of each reward term of an evaluation by reward
    functions, in its order (the mean None until it has succeeded)."""
    means = evaluation.result.get("terms") or {}
    return [(name, weight, args, means.get(name)) for name, weight, args in _terms_text(evaluation.reward_terms)]


def _terms_text(terms: list[dict[str, Any]]) -> list[tuple[str, float, str]]:
    return [(term["name"], term.get("weight", 1.0),
             json.dumps(term["args"], ensure_ascii=False, sort_keys=True) if term.get("args") else "") for term in terms]


def example_rows(evaluation: Evaluation) -> list[dict[str, str]]:
    """The first completions of a succeeded evaluation as text to show (escaped by the template): a prompt given
    as a chat (a list of turns) as its JSON, not Python's list notation; by reward functions, with each term's
    score (in ``term_rows``' order) and the total."""
    def shown(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1)

    names = [row[0] for row in term_rows(evaluation)]
    return [{"prompt": shown(example["prompt"]), "answer": shown(example["answer"]), "text": example["text"],
             "total": example.get("total"), "scores": [(example.get("scores") or {}).get(name) for name in names]}
            for example in evaluation.result.get("examples", [])]


def _active() -> QuerySet[Evaluation]:
    return Evaluation.objects.filter(status__in=ACTIVE_EVALUATION_STATUSES).order_by("created_at")


def _sentence(evaluation: Evaluation, what: str) -> str:
    return (f"evaluation {evaluation.public_id} of {isolated(evaluation.model_label)} is {evaluation.status} "
            f"{what}; cancel it or wait for it to finish")


def model_evaluation_readers(*, project_id: int, model_id: str, model: str) -> list[str]:
    """The queued or running evaluations of the model ``model_id`` (a base model's id, or a run's, which covers its
    checkpoints), one sentence each for a deletion of it to refuse; ``model`` names it ("it", "its model"). A
    cancelled one holds nothing: its worker's result is dropped, and a model deleted under its load fails it
    unseen."""
    return [_sentence(evaluation, f"with {model}")
            for evaluation in _active().filter(_of_model(model_id), project_id=project_id)]


def version_evaluation_readers(*, versions: list[DatasetVersion]) -> list[str]:
    """The queued or running evaluations reading one of ``versions``, one sentence each."""
    return [_sentence(evaluation, f"on {isolated(evaluation.version_label)}")
            for evaluation in _active().filter(dataset_version__in=versions)]


def project_evaluation_readers(*, project: Project) -> list[str]:
    """The project's queued or running evaluations, one sentence each."""
    return [_sentence(evaluation, f"on {isolated(evaluation.version_label)}")
            for evaluation in _active().filter(project=project)]
