"""Writes of the chat: conversations, turns, generation requests to the serve worker, and the
worker's report of a finished answer.

A user turn creates the user message and an empty ``streaming`` assistant message in one
transaction; on commit the whole conversation goes to the ``serve`` queue as one
``worker.tasks.serve.generate`` request whose generation id is the assistant message's id, so the
page follows ``webapp.chat.channels`` events of that id.
"""
from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import redis
from kombu.exceptions import OperationalError
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from jaxengine.chat_template import ChatTemplateError, template_variable_problem
from webapp.basemodels.models import BaseModel
from webapp.celery import app as celery_app
from webapp.chat import channels
from webapp.chat.models import ApiGeneration, Conversation, Message, MessageStatus, ProjectToken, Role
from webapp.chat.selectors import (ModelChoice, chat_template_variables, conversation_readers, rendered_prompt,
                                   structured_template_variables)
from webapp.core.bidi import isolated
from webapp.core.templatetags.temper import when
from webapp.core.text import NUL, checked_text, storable_model_text
from webapp.projects.models import Project
from webapp.projects.services import project_lock
from webapp.runs.channels import redis_client
from webapp.runs.models import Run

logger = logging.getLogger(__name__)

GENERATE_TASK = "worker.tasks.serve.generate"
PREPARE_TASK = "worker.tasks.serve.prepare"
# Answers one /v1 request may ask for (n): rows of the serve worker's batch decoded together, each a choice.
MAX_CHOICES = 8
TITLE_CHARS = 80
# The longest user turn or arena prompt, in characters (the chat's form says so too). Far past any context
# the served models have; the bound keeps a pasted file out of the database.
MESSAGE_MAX_CHARS = 100_000
# A conversation's chat template variables (Conversation.template_variables): how many, and the longest text value
# (a persona, a style guide). The serve request takes 32 variables, the model's own included.
TEMPLATE_VARIABLES_MAX = 16
TEMPLATE_VARIABLE_MAX_CHARS = 4_000
# Time a request may wait in the serve queue, on top of its generation's own timeout (see answer_is_lost).
LOST_ANSWER_GRACE_SECONDS = 120
# Time a generation may wait, once its serve worker has the model loaded, for its programs to compile and for a free
# row; its TEMPER_SERVE_TIMEOUT_SECONDS start after that (worker.tasks.serve.generate, jaxengine ServeRequest.time_limit).
FIRST_TOKEN_WAIT_SECONDS = 120
FINISH_STATUS = {"stop": MessageStatus.COMPLETE, "length": MessageStatus.COMPLETE,
                 "cancelled": MessageStatus.STOPPED, "timeout": MessageStatus.TIMEOUT}


class ChatError(ValueError):
    """A turn that cannot be taken now (e.g. an answer is still being written)."""


# A conversation started and left without a message is deleted after this long (when its author next
# starts one): long enough that a tab left open on it can still send.
EMPTY_CONVERSATION_KEPT = timedelta(days=1)


@transaction.atomic
def conversation_create(*, project: Project, user, model: ModelChoice, system_prompt: str = "",
                        temperature: float = 0.7, top_p: float = 1.0, top_k: int = 0,
                        max_tokens: int = 256, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                        stop: list[str] | None = None, enable_thinking: bool | None = None,
                        template_variables: dict[str, Any] | None = None) -> Conversation:
    """A new conversation (its page opens at once, and prepares the model while the person types).
    ``template_variables``: values of the model's chat template variables, checked (``checked_template_variables``:
    a ``ValidationError`` keyed ``template_variables``, nothing saved). The author's conversations in the project
    that were started over ``EMPTY_CONVERSATION_KEPT`` ago and never got a message are deleted: the list does not
    show them, and nothing else refers to them. A model whose directory is gone (``ModelChoice.gone``) is refused
    (``ValidationError`` keyed ``model``): no conversation could ever be answered by it."""
    if model.gone:
        raise ValidationError({"model": model.refused})
    template_variables = checked_template_variables(model=model, variables=template_variables or {},
                                                    system_prompt=system_prompt, enable_thinking=enable_thinking)
    (Conversation.objects.filter(project=project, user=user, in_arena=False,
                                 created_at__lt=timezone.now() - EMPTY_CONVERSATION_KEPT)
     .exclude(Exists(Message.objects.filter(conversation=OuterRef("pk")))).delete())
    return Conversation.objects.create(
        project=project, user=user, model_ref=model.ref, model_label=model.label, system_prompt=system_prompt,
        temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty, stop=list(stop or []), enable_thinking=enable_thinking,
        template_variables=template_variables)


def checked_template_variables(*, model: ModelChoice, variables: dict[str, Any], system_prompt: str = "",
                               enable_thinking: bool | None = None,
                               prompts: Iterable[tuple[str, list[dict[str, Any]]]] | None = None) -> dict[str, Any]:
    """``variables`` for a conversation with ``model``, once each is a name its chat template reads
    (``selectors.chat_template_variables``) and a JSON scalar of at most ``TEMPLATE_VARIABLE_MAX_CHARS``, at most
    ``TEMPLATE_VARIABLES_MAX`` of them, and the template renders a first turn with them; else a ``ValidationError``
    keyed ``template_variables`` naming the variable (or the template's line) and what to do. ``prompts``: the turns
    the template is to render instead of a first turn, each with where it comes from (a generated review campaign's
    prompts, by row), which a refusal names with the template's line; they are rendered with no variables too, a
    refusal then keyed ``prompts_version``."""
    if not variables and prompts is None:
        return {}
    readable = chat_template_variables(model) if variables else {}
    problems = []
    if len(variables) > TEMPLATE_VARIABLES_MAX:
        problems.append(f"{len(variables)} template variables given; set at most {TEMPLATE_VARIABLES_MAX}")
    for name, value in variables.items():
        if name not in readable:
            problems.append(unread_variable_problem(name=str(name), model=model, readable=readable, remedy="leave it out"))
        elif problem := template_variable_problem(name, value):
            problems.append(f"{name}: {problem}")
        elif isinstance(value, str) and (problem := _text_problem(value)):
            problems.append(f"{name}: {problem}")
    if problems:
        raise ValidationError({"template_variables": problems})
    turns = [{"role": "system", "content": system_prompt}] if system_prompt else []
    variables = dict(variables)
    for where, messages in prompts if prompts is not None else [("", [*turns, {"role": "user", "content": "Hello"}])]:
        _check_renders(model=model, variables=variables, enable_thinking=enable_thinking, messages=messages,
                       where=where)
    return variables


def unread_variable_problem(*, name: str, model: ModelChoice, readable, remedy: str) -> str:
    """Why ``name`` is no variable a conversation with ``model`` sets: its chat template reads it as a list or
    mapping (``selectors.structured_template_variables``), or does not read it (``readable``: those it does)."""
    if name in structured_template_variables(model):
        return (f"{name}: the chat template of {isolated(model.label)} reads it as a list or mapping, which a chat does "
                f"not set (tools reach it through a /v1 request's tools); {remedy}")
    reads = ", ".join(readable) or "none that a chat sets"
    return f"{isolated(name)}: the chat template of {isolated(model.label)} does not read it (it reads {reads}); {remedy}"


def _text_problem(value: str) -> str | None:
    try:
        checked_text(value, field="value", max_length=TEMPLATE_VARIABLE_MAX_CHARS)
    except ValidationError as error:
        return error.message_dict["value"][0]
    return None


def template_kwargs_of(conversation: Conversation, model: ModelChoice) -> dict[str, Any]:
    """The chat template variables a turn of ``conversation`` sends (``chat_template_kwargs``), over the model's own
    file's: a run's model's as its Run row has them (``ModelChoice.template_kwargs``), then the Thinking switch, then
    the conversation's own variables."""
    variables = dict(model.template_kwargs)
    if conversation.enable_thinking is not None:
        variables["enable_thinking"] = conversation.enable_thinking
    return {**variables, **conversation.template_variables}


def _check_renders(*, model: ModelChoice, variables: dict[str, Any], enable_thinking: bool | None,
                   messages: list[dict[str, str]], where: str = "") -> None:
    """Refuse (``ValidationError`` keyed ``template_variables``) ``variables`` that ``model``'s chat template fails
    on for ``messages`` (from ``where``, which the refusal begins with), before anything is sent: the serve worker
    would only fail the answer. Without variables the template fails on the conversation itself, keyed
    ``chat_template``."""
    probe = Conversation(template_variables=variables, enable_thinking=enable_thinking)
    try:
        rendered_prompt(model=model, messages=messages, variables=template_kwargs_of(probe, model))
    except ChatTemplateError as error:
        if where and not variables:  # a generated campaign's prompt the template itself refuses
            raise ValidationError({"prompts_version": (
                f"{where}: the chat template of {isolated(model.label)} fails on it: {error}. Nothing was made; "
                "choose other prompts (fewer of them, or another version), or another model")}) from None
        if where:  # a generated campaign's prompt: the row and the template's line
            raise ValidationError({"template_variables": (
                f"{where}: the chat template of {isolated(model.label)} fails on it with the template variables "
                f"{_shown_variables(variables)}: {error}. Nothing was made; give other values, or choose other "
                "prompts")}) from None
        if not variables:  # the template itself refuses the conversation (changed since, or a system turn it refuses)
            raise ValidationError({"chat_template": (
                f"the chat template of {isolated(model.label)} fails on this conversation: {error}. Nothing was sent; "
                "start a new conversation with another model or without what the template refuses")}) from None
        raise ValidationError({"template_variables": (
            f"the chat template of {isolated(model.label)} fails with the template variables "
            f"{_shown_variables(variables)}: {error}. Nothing was sent; give other values (a new conversation with "
            "these settings keeps the rest)")}) from None


def _shown_variables(variables: dict[str, Any]) -> str:
    return ", ".join(f"{name} = {isolated(json.dumps(value, ensure_ascii=False)[:80])}"
                     for name, value in variables.items())


@transaction.atomic
def conversation_delete(*, conversation: Conversation) -> None:
    """Delete ``conversation`` with its messages; nothing else refers to a chat conversation. Refused
    (``ValidationError`` on ``delete``) while something still needs it (``selectors.conversation_readers``):
    an answer being written (stop it first), or a battle it is a side of (the arena's record)."""
    conversation = Conversation.objects.select_for_update(of=("self",)).get(pk=conversation.pk)
    if problems := conversation_readers(conversation=conversation):
        raise ValidationError({"delete": problems})
    public_id = conversation.public_id
    conversation.delete()
    logger.info("conversation %s deleted", public_id)


def model_prepare(*, model: ModelChoice, project_slug: str) -> None:
    """Ask the serve worker to load ``model`` (and compile its programs) while the person writes their
    first message (``worker.tasks.serve.prepare``). A hint: it is sent once, without retries, and a
    broker that is down costs the page nothing (the message itself reports that when sent). A model its project may
    not load (``ModelChoice.refused``) is not sent."""
    if model.refused:
        return

    def send() -> None:
        try:
            celery_app.send_task(PREPARE_TASK, args=[model.cache_key, model.path, project_slug], queue="serve",
                                 retry=False)
        except OperationalError as error:
            logger.warning("could not ask the serve worker to prepare %s: %s", model.cache_key, error)

    transaction.on_commit(send)


def models_deleted(*, refs: list[str]) -> None:
    """Once the deletion of the models ``refs`` (a run: its checkpoints too; a base model) commits, name them
    for the serve workers (``channels.models_deleted``), which drop their weights at once instead of
    keeping them until evicted. Without Redis it is only logged: the weights then stay until evicted, though
    nothing can ask for those models any more."""
    def send() -> None:
        try:
            channels.models_deleted(redis_client(), refs)
        except redis.RedisError as error:
            logger.warning("the serve workers were not told that %s were deleted: %s", ", ".join(refs), error)

    transaction.on_commit(send)


def _usable_answer(message: Message | None) -> bool:
    """Whether an answer is text the person saw and the model may read back: finished, stopped or cut
    by the timeout, with some text (not failed, not empty)."""
    return (message is not None and message.role == Role.ASSISTANT and bool(message.content)
            and message.status in (MessageStatus.COMPLETE, MessageStatus.STOPPED, MessageStatus.TIMEOUT))


def history(conversation: Conversation, *, messages: list[Message] | None = None) -> list[dict[str, str]]:
    """The turns the model reads: the system prompt, each earlier user turn with its answer, and the newest
    user turn (of ``messages``, the conversation's own by default). A turn whose answer failed or came out empty is
    left out with its answer, so that user and assistant turns alternate, as many chat templates demand (Gemma's,
    Llama 2's and Mistral's raise "Conversation roles must alternate"): a lone user turn left in made every later
    turn of the conversation fail."""
    turns = [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
    messages = list(conversation.messages.all()) if messages is None else messages
    newest_user_turn = max((index for index, message in enumerate(messages) if message.role == Role.USER), default=-1)
    for index, message in enumerate(messages):
        following = messages[index + 1] if index + 1 < len(messages) else None
        if message.role == Role.USER and (index == newest_user_turn or _usable_answer(following)):
            turns.append({"role": message.role, "content": message.content})
        elif _usable_answer(message):
            turns.append({"role": message.role, "content": message.content})
    return turns


def regenerate_history(conversation: Conversation) -> list[dict[str, str]] | None:
    """The turns Regenerate sends (``message_regenerate``): the ``history`` without the newest answer, which it
    replaces; that answer's own prompt. None where the conversation ends with no answer to regenerate."""
    messages = list(conversation.messages.all())
    if not messages or messages[-1].role != Role.ASSISTANT:
        return None
    return history(conversation, messages=messages[:-1])


def check_turn_text(text: str, *, field: str, what: str) -> None:
    """Refuse a user turn (``what``: "message", or an arena "prompt", sent as form field ``field``) that is
    blank, holds a NUL or is past ``MESSAGE_MAX_CHARS``: bad input, so a ``ValidationError`` keyed by the
    field (a 400), not a ``ChatError`` (a turn refused for the conversation's state, a 409)."""
    if not text.strip():
        raise ValidationError({field: f"the {what} is empty or only white space; write something to send"})
    if NUL in text:
        raise ValidationError({field: f"the {what} holds a NUL character (\\x00); remove it"})
    if len(text) > MESSAGE_MAX_CHARS:
        raise ValidationError({field: f"the {what} is {len(text):,} characters long; at most {MESSAGE_MAX_CHARS:,}"})


def _enqueue_answer(conversation: Conversation, model: ModelChoice) -> Message:
    answer = Message.objects.create(conversation=conversation, role=Role.ASSISTANT, status=MessageStatus.STREAMING)
    request = {"id": answer.public_id, "message": answer.public_id, "model_key": model.cache_key,
               "model_path": model.path, "project_slug": conversation.project.slug, "messages": history(conversation), "max_new_tokens": conversation.max_tokens,
               "temperature": conversation.temperature, "top_p": conversation.top_p, "top_k": conversation.top_k,
               "presence_penalty": conversation.presence_penalty, "frequency_penalty": conversation.frequency_penalty,
               "stop": conversation.stop,
               "seed": secrets.randbelow(2**31),  # a regenerated answer draws anew
               "fit_context": True}  # a long conversation leaves out its oldest turns instead of failing
    if variables := template_kwargs_of(conversation, model):
        request["chat_template_kwargs"] = variables
    transaction.on_commit(lambda: celery_app.send_task(GENERATE_TASK, args=[request], queue="serve",
                                                       expires=generation_expiry_seconds()))
    return answer


def model_lock(*, project: Project, ref: str, label: str, doing: str, field: str = "__all__") -> None:
    """Lock the rows of ``project`` and of the model ``ref`` (its run, or base model) that work is about to ask for
    answers — a chat or arena turn, a review campaign's generation — inside the caller's transaction, as their
    deletions lock them before looking for that work (``runs.selectors.run_readers`` and the like): a deletion
    under way waits for it and is then refused, naming the work; one that committed first left nothing to lock,
    and the work is refused (``ValidationError`` keyed by ``field``; ``doing`` ends its sentence, "as the message
    was being sent"). Without it, work started as the model was deleted was queued all the same, and the serve
    worker answered from weights it still held, or failed on files removed under it."""
    project_lock(project=project, doing=doing)
    rows = (Run.objects.filter(public_id=ref.split(":", 1)[0]) if ref.startswith("run_")
            else BaseModel.objects.filter(public_id=ref))
    if not rows.select_for_update(no_key=True, of=("self",)).filter(project_id=project.pk).exists():
        raise ValidationError({field: f"the model {isolated(label)} was deleted {doing}; choose another model"})


def chat_model_lock(*, project: Project, model: ModelChoice, doing: str) -> None:
    """``model_lock`` for a chat or arena turn, refused as a ``ChatError`` (the turn's state, not its text), as is a
    model its project may not load (``ModelChoice.refused``), before anything is saved."""
    if model.refused:
        raise ChatError(model.refused)
    try:
        model_lock(project=project, ref=model.ref, label=model.label, doing=doing)
    except ValidationError as error:
        raise ChatError(" ".join(error.messages)) from None


@transaction.atomic
def api_generation_start(*, token: ProjectToken, model: ModelChoice, generation_id: str) -> ApiGeneration:
    """Record the ``/v1`` completion ``generation_id`` asked of ``model`` with ``token``, before its request is
    queued, under the lock of its project's and model's rows (``model_lock``): a deletion of either under way waits
    and is then refused, naming the completion (``selectors.answers_being_written``); one that committed first
    refuses the completion (``ValidationError``). ``api_generation_end`` deletes the row once the answer ends; the
    project's rows their view left behind (a process that died) go here. A model its project may not load
    (``ModelChoice.refused``) is refused (``ValidationError`` keyed ``model``)."""
    if model.refused:
        raise ValidationError({"model": model.refused})
    model_lock(project=token.project, ref=model.ref, label=model.label, doing="as the completion was being asked for")
    lost = timezone.now() - timedelta(seconds=generation_expiry_seconds())
    ApiGeneration.objects.filter(project=token.project, created_at__lt=lost).delete()
    return ApiGeneration.objects.create(public_id=generation_id, project=token.project, user=token.user,
                                        token_name=token.name, model_ref=model.ref)


def api_generation_end(*, generation_id: str) -> None:
    """The ``/v1`` completion ``generation_id`` was answered (or refused, or its client went away)."""
    ApiGeneration.objects.filter(public_id=generation_id).delete()


@transaction.atomic
def message_send(*, conversation: Conversation, model: ModelChoice, content: str) -> Message:
    """Add a user turn and ask for the answer; returns the (streaming) assistant message. Bad text is a
    ``ValidationError`` keyed by ``content``, the chat form's field; a conversation the model's chat template fails on
    one keyed ``template_variables`` or ``chat_template`` (``_check_renders``)."""
    check_turn_text(content, field="content", what="message")
    chat_model_lock(project=conversation.project, model=model, doing="as the message was being sent")
    conversation = Conversation.objects.select_for_update(of=("self",)).get(pk=conversation.pk)
    if conversation.messages.filter(status=MessageStatus.STREAMING).exists():
        raise ChatError("an answer is still being written; stop it or wait for it to finish")
    Message.objects.create(conversation=conversation, role=Role.USER, content=content, has_text=has_text(content))
    # A template that fails on this conversation (with its variables, or as the model's template now stands): refused,
    # nothing saved.
    _check_renders(model=model, variables=conversation.template_variables,
                   enable_thinking=conversation.enable_thinking, messages=history(conversation))
    if not conversation.title:
        conversation.title = content.strip().splitlines()[0][:TITLE_CHARS]
    conversation.save()
    return _enqueue_answer(conversation, model)


@transaction.atomic
def message_regenerate(*, conversation: Conversation, model: ModelChoice) -> Message:
    """Replace the last answer with a new one (a new seed) for the same conversation."""
    chat_model_lock(project=conversation.project, model=model, doing="as the message was being sent")
    conversation = Conversation.objects.select_for_update(of=("self",)).get(pk=conversation.pk)
    last = conversation.messages.order_by("-created_at", "-id").first()
    if last is None or last.role != Role.ASSISTANT:
        raise ChatError("there is no answer to regenerate; send a message first")
    if last.status == MessageStatus.STREAMING:
        raise ChatError("an answer is still being written; stop it or wait for it to finish")
    last.delete()
    _check_renders(model=model, variables=conversation.template_variables,
                   enable_thinking=conversation.enable_thinking, messages=history(conversation))
    conversation.save()
    return _enqueue_answer(conversation, model)


def generation_expiry_seconds() -> int:
    """How long a generation request stays worth doing: past ``answer_is_lost``'s limit its answer is given
    up, so a worker that takes it later (it waited behind others, or its first worker died holding it and
    it was queued again) drops it (Celery's ``expires``) instead of writing an answer nobody waits for."""
    return settings.TEMPER_SERVE_TIMEOUT_SECONDS + FIRST_TOKEN_WAIT_SECONDS + LOST_ANSWER_GRACE_SECONDS


def answer_is_lost(message: Message, *, now: datetime | None = None) -> bool:
    """Whether a streaming answer has no serve worker behind it: every generation ends by its deadline,
    ``FIRST_TOKEN_WAIT_SECONDS`` + ``TEMPER_SERVE_TIMEOUT_SECONDS`` after a worker has its model loaded, so one still
    streaming ``LOST_ANSWER_GRACE_SECONDS`` past that (time for the queue and the load) lost its worker or its request."""
    age = ((now or timezone.now()) - message.created_at).total_seconds()
    return message.status == MessageStatus.STREAMING and age > generation_expiry_seconds()


def message_stop(*, message: Message) -> None:
    """Ask the serve worker to stop writing ``message`` (it ends ``stopped`` with what it has). An answer no
    worker will finish (``answer_is_lost``) fails at once instead, so its conversation can go on."""
    if message.status != MessageStatus.STREAMING:
        return
    if message_give_up_if_lost(message=message):
        return
    try:
        channels.request_stop(redis_client(), message.public_id)
    except redis.RedisError as error:
        raise ChatError(f"the stop request did not reach Redis ({error}); the answer ends by its timeout") from None


def message_give_up_if_lost(*, message: Message) -> bool:
    """Fail ``message`` when no worker will finish it (``answer_is_lost``), telling a page that follows it;
    whether it was lost. An arena battle has no Stop: its page gives up lost answers so the vote opens."""
    if not answer_is_lost(message):
        return False
    _give_up(message)
    return True


def has_text(content: str) -> bool:
    """Whether a message's ``content`` holds text: not empty, not only whitespace (``Message.has_text``)."""
    return bool(content.strip())


def message_finish(*, message_id: str, text: str = "", finish_reason: str = "", completion_tokens: int = 0,
                   first_token_seconds: float | None = None, error: str = "") -> None:
    """Record the serve worker's outcome of an answer: its text and why it ended, or the error."""
    status = MessageStatus.FAILED if error else FINISH_STATUS[finish_reason]
    content = storable_model_text(text)
    Message.objects.filter(public_id=message_id, status=MessageStatus.STREAMING).update(
        content=content, has_text=has_text(content), status=status, error=error, completion_tokens=completion_tokens,
        first_token_seconds=first_token_seconds)


def _give_up(message: Message) -> None:
    error = (f"no serve worker finished this answer, asked at {when(message.created_at)} (a generation ends within "
             f"{FIRST_TOKEN_WAIT_SECONDS} s of its model being loaded, for compiling, plus TEMPER_SERVE_TIMEOUT_SECONDS = "
             f"{settings.TEMPER_SERVE_TIMEOUT_SECONDS} s); it was given up: regenerate it or send the message again")
    if not Message.objects.filter(pk=message.pk, status=MessageStatus.STREAMING).update(
            status=MessageStatus.FAILED, error=error):
        return  # the worker finished it meanwhile
    try:  # the page following the answer ends on this event; without Redis it sees the failure on reload
        client = redis_client()
        channels.emit(client, message.public_id, {"seq": client.llen(channels.events_key(message.public_id)),
                                                  "type": "error", "message": error})
    except redis.RedisError as redis_error:
        logger.warning("answer %s given up; its event did not reach Redis: %s", message.public_id, redis_error)
