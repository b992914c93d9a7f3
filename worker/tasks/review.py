"""Review campaign tasks. Thin: ids in, a service call (``default`` queue), or for a campaign on two
models' answers, generation with the ``serve`` worker's loaded models (``serve`` queue)."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ValidationError

from webapp.basemodels.inspection import ModelDirError, check_registered_model_dir
from webapp.celery import app
from webapp.review import services
from webapp.review.models import Campaign
from worker.tasks.answers import GenerationError, GenerationStopped, answers_in_slices

logger = logging.getLogger(__name__)


@app.task(name="worker.tasks.review.load_campaign_items", acks_late=True)
def load_campaign_items(campaign_id: int, attempt: int | None = None) -> None:
    """Make a loading campaign's items from its dataset version (safe to redeliver; a message of a
    superseded attempt does nothing; one sent before attempts were numbered loads as the current one)."""
    services.campaign_load_items(campaign_id=campaign_id, attempt=attempt)


@app.task(name="worker.tasks.review.write_export", acks_late=True)
def write_export(export_id: int) -> None:
    """Write a campaign export as a new dataset version (safe to redeliver)."""
    services.export_write(export_id=export_id)


@app.task(name="worker.tasks.review.generate_campaign_answers", acks_late=True)
def generate_campaign_answers(campaign_id: int) -> None:
    """Generate both models' answers to a generating campaign's prompts, then make its items at once
    (``services.generation_finish``); any failure fails the campaign with the reason and no items.
    Stops after the slice of prompts under way once an owner cancelled or deleted the campaign; until it
    has stopped, the campaign says it is being answered (``generation_running``), which keeps its models
    from being deleted. Sent to the ``serve`` queue: safe to redeliver (a campaign that is no longer generating is left
    alone, and only the first finish makes items)."""
    campaign = services.generation_begin(campaign_id=campaign_id)
    if campaign is None:
        return
    try:
        _generate(campaign)
    finally:
        # Also after a cancel: the models' deletion waited for this (``selectors.generation_readers``).
        services.generation_end(campaign_id=campaign_id)


def _generate(campaign: Campaign) -> None:
    campaign_id, generation = campaign.pk, campaign.generation
    try:
        prompts = services.generation_prompts(campaign=campaign)
        settings = services.GenerationSettings(**generation["sampling"])
        for model in (generation["model_a"], generation["model_b"]):  # the web checked them; a folder may move since
            _check_model_dir(model, project_slug=campaign.project.slug)
        # Model A answers every prompt first, then model B: the cache need hold only one at a time.
        answers_a = model_answers(generation["model_a"], prompts, settings, on_progress=lambda count: (
            services.generation_progress(campaign_id=campaign_id, answers=count)))
        answers_b = model_answers(generation["model_b"], prompts, settings, on_progress=lambda count: (
            services.generation_progress(campaign_id=campaign_id, answers=len(prompts) + count)))
    except GenerationStopped:
        logger.info("review campaign %s: generation stopped, the campaign was cancelled or deleted",
                    campaign.public_id)
        return
    except ValidationError as error:
        services.generation_fail(campaign_id=campaign_id, reason=" ".join(error.messages))
        return
    except GenerationError as error:
        services.generation_fail(campaign_id=campaign_id, reason=str(error))
        return
    except Exception as error:  # reported on the campaign page, logged with its traceback for the operator
        logger.exception("review campaign %s: generation failed", campaign.public_id)
        services.generation_fail(campaign_id=campaign_id, reason=f"the generation failed: {error}")
        return
    services.generation_finish(campaign_id=campaign_id, prompts=prompts, answers_a=answers_a, answers_b=answers_b)


def _check_model_dir(model: dict[str, Any], *, project_slug: str) -> None:
    """``GenerationError`` naming ``model`` when its directory may not be loaded for the campaign's project
    (``check_registered_model_dir``: it lies now in another project's folder)."""
    try:
        check_registered_model_dir(model["path"], models_root=django_settings.MODELS_ROOT, project_slug=project_slug)
    except ModelDirError as error:
        raise GenerationError(f"{model['label']} cannot be loaded: {error}") from None


def model_answers(model: dict[str, Any], prompts: list[services.GenerationPrompt],
                  settings: services.GenerationSettings, *, on_progress: Callable[[int], bool]) -> list[str]:
    """``model``'s answer to every prompt, generated through the serve worker's cache and batching
    server for that model, so that a model already loaded for chats is not loaded twice, a slice of the
    server's batch size at a time (``answers.answers_in_slices``): ``on_progress`` is told the answers so far
    after each slice and says whether to go on (``GenerationStopped`` when not). Prompt ``i`` uses seed
    ``settings.seed + i`` (the same for both models), and is
    rendered with the campaign's template variables ``model["template_variables"]`` (those its template reads) over
    ``settings.chat_template_kwargs`` (the Thinking switch) over a run's model's ``template_kwargs`` (its Run row's,
    ``webapp.chat.selectors.ModelChoice``) over the model's own template variables.
    Each answer has ``TEMPER_REVIEW_ANSWER_TIMEOUT_SECONDS`` from its slice's submission; one cut
    by it ends the generation (``GenerationError``, naming the model, the row and what to do)."""
    from jaxengine.chat_template import ChatTemplateError
    from jaxengine.data.pipeline import DataError, encode_prompt
    from jaxengine.sampler import PromptError, SamplingParams
    from jaxengine.serving import ServeRequest
    # The serve worker's model cache and per-model batching servers (one per process).
    from worker.tasks.serve import server_for

    server, tokenizer = server_for(model["cache_key"], model["path"])
    # Without a deadline one slice could hold the serve worker (and the chats waiting behind it) for as long as it
    # took; a chat answer's (TEMPER_SERVE_TIMEOUT_SECONDS) would be too short for a campaign's longest answers.
    timeout = django_settings.TEMPER_REVIEW_ANSWER_TIMEOUT_SECONDS
    # A run's model's variables as its Run row has them (a campaign made before they were recorded has none), then the
    # Thinking switch, then the campaign's own variables this model's template reads, as a chat turn lays them.
    variables = {**model.get("template_kwargs", {}), **settings.chat_template_kwargs,
                 **model.get("template_variables", {})}
    requests = []
    for index, prompt in enumerate(prompts):
        try:
            request = ServeRequest(
                prompt_ids=tuple(encode_prompt(tokenizer, prompt.prompt, **variables)),
                params=SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                                      top_p=settings.top_p, top_k=settings.top_k, seed=settings.seed + index))
            server.decoder.check(request)
        except (PromptError, DataError, ChatTemplateError) as error:  # the last names the template's file
            raise GenerationError(f"{model['label']} cannot answer row {prompt.row} of the prompts: {error}") from None
        requests.append(request)
    def cut_answer(index: int) -> str:  # a cut answer would be reviewed as if it were whole
        return (f"{model['label']} took longer than {timeout} s (TEMPER_REVIEW_ANSWER_TIMEOUT_SECONDS) to answer row "
                f"{prompts[index].row} of the prompts, and its answer was cut; allow fewer new tokens, choose fewer "
                "prompts or a smaller model, or give the serve worker a larger TEMPER_REVIEW_ANSWER_TIMEOUT_SECONDS")

    return answers_in_slices(server, requests, timeout=timeout, on_progress=on_progress, cut_answer=cut_answer)
