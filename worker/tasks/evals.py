"""Evaluation task (``serve`` queue, ``webapp.evals.services``). Thin: the evaluation's id in; its rows read as the
web checked them, its model loaded by the engine, and ``jaxengine.evaluate`` called; the result or a failure in
words recorded."""
from __future__ import annotations

import logging
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ValidationError

from webapp.basemodels.inspection import ModelDirError, check_registered_model_dir
from webapp.celery import app
from webapp.chat.selectors import model_choice
from webapp.evals import services
from webapp.evals.models import Evaluation, Metric

logger = logging.getLogger(__name__)


class EvaluationError(Exception):
    """Why an evaluation cannot be scored, in words for its page."""


@app.task(name="worker.tasks.evals.run_evaluation", acks_late=True)
def run_evaluation(evaluation_id: int) -> None:
    """Score a queued evaluation (safe to redeliver: one no longer queued is left alone). Its result is dropped
    when it was cancelled meanwhile (``services.evaluation_finish``)."""
    evaluation = services.evaluation_start(evaluation_id=evaluation_id)
    if evaluation is None:
        return
    try:
        result = score(evaluation)
    except (EvaluationError, ValidationError) as error:
        reason = " ".join(error.messages) if isinstance(error, ValidationError) else str(error)
        services.evaluation_fail(evaluation_id=evaluation_id, reason=reason)
        return
    except Exception as error:  # said on the evaluation's page, logged with its traceback for the operator
        logger.exception("evaluation %s failed", evaluation.public_id)
        services.evaluation_fail(evaluation_id=evaluation_id, reason=f"the evaluation failed: {error}")
        return
    finally:
        from worker.tasks.serve import drop_retired_programs_past_high_water

        drop_retired_programs_past_high_water()  # it compiled its model's sampling or scoring programs
    services.evaluation_finish(evaluation_id=evaluation_id, result=result)


def score(evaluation: Evaluation) -> dict[str, Any]:
    """``jaxengine.evaluate``'s result for ``evaluation``: its model (as the chat serves it now) on the rows the web
    checked."""
    from jaxengine import evaluate

    version = evaluation.dataset_version
    if version is None:
        raise EvaluationError(f"the dataset version {evaluation.version_label} has been deleted")
    rows = services.version_rows(version=version, metric=evaluation.metric, row_limit=evaluation.row_limit,
                                 answer_column=evaluation.answer_column)
    terms = []
    if evaluation.metric == Metric.REWARDS:  # checked again before the model is loaded: a reward run may be gone
        _stored, terms = services.scoring_terms(project=evaluation.project, written=evaluation.reward_terms,
                                                rows=rows, version=version)
    model, tokenizer = evaluate.load_for_scoring(_model_dir(evaluation))
    if evaluation.metric == Metric.EXACT_MATCH:
        return evaluate.exact_match(model, tokenizer, rows, max_new_tokens=evaluation.max_new_tokens,
                                    by=evaluation.group_by or None)
    if evaluation.metric == Metric.REWARDS:
        return evaluate.reward_scores(model, tokenizer, rows, terms, max_new_tokens=evaluation.max_new_tokens,
                                      by=evaluation.group_by or None)
    return evaluate.mean_loss(model, tokenizer, rows)


def _model_dir(evaluation: Evaluation) -> str:
    """The directory the evaluation's model serves from now; ``EvaluationError`` where it may not be loaded."""
    choice = model_choice(project=evaluation.project, ref=evaluation.model_ref)
    if choice is None:
        raise EvaluationError(f"{evaluation.model_label} is no longer a model of this project (it was deleted)")
    if choice.refused:
        raise EvaluationError(f"{evaluation.model_label} cannot be loaded: {choice.refused}")
    try:
        check_registered_model_dir(choice.path, models_root=django_settings.MODELS_ROOT,
                                   project_slug=evaluation.project.slug)
    except ModelDirError as error:
        raise EvaluationError(f"{evaluation.model_label} cannot be loaded: {error}") from None
    return choice.path
