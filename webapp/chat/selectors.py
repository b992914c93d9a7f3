"""Reads for the chat pages: the models a project can chat with, a user's conversations."""
from __future__ import annotations

import functools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from jaxengine.models.config import served_vocab_size
from webapp.basemodels.models import BaseModel
from webapp.basemodels.selectors import (FOLDER_GONE, REGISTER_AGAIN, gone_model_words, load_refusal, model_dir_gone,
                                         named_model)
from webapp.chat.models import ApiGeneration, Battle, Conversation, Message, MessageStatus
from webapp.core import file_stamps
from webapp.core.bidi import isolated
from webapp.core.model_refs import BASE_MODEL_LABEL, RUN_LABEL, chat_ref, checkpoint_of
from webapp.projects.models import Membership, Project, Role
from webapp.runs.models import ACTIVE_STATUSES, REWARD_TASK, Artifact, Run, RunStatus
from webapp.runs.services import EXTERNAL_TASK
from webapp.runs.serving_copies import base_model_copy_dir, export_copy_dir, served_model

_CHECKPOINT_DIR = re.compile(r"export-step-(\d+)$")


@dataclass(frozen=True, kw_only=True)
class ModelChoice:
    """A model to chat with: ``ref`` as stored on a conversation, a label, the directory served (its
    quantized serving copy once it has one: ``webapp.runs.serving_copies.served_model``) and that copy's
    ``quantization`` (int8, int4; "" when the model serves unquantized). ``option_label`` is the label
    with the model's or run's name bidi-isolated and the copy named, for an ``<option>`` (``label`` is
    stored on conversations and compared, so it stays the plain name, whichever copy serves).
    ``template_kwargs`` are a run's model's chat template variables (``_template_kwargs``), sent with each of
    its requests under a request's own. ``refused``: why a base model may not be loaded for its project
    (``webapp.basemodels.selectors.load_refusal``: its directory lies now in another project's folder), "" when it
    may; a refused model is offered (its conversations say why), never sent to a worker nor its files read.
    ``gone``: the directory it would be served from was deleted from disk since (``model_dir_gone``); ``refused`` then
    says so, as a launch does, the pickers list it as gone, and no new conversation, battle or ``/v1`` request takes
    it (``/v1/models`` leaves it out)."""

    ref: str
    label: str
    option_label: str
    path: str
    quantization: str = ""
    created: int = 0  # when the model was registered or its run finished (Unix seconds), for /v1/models
    template_kwargs: dict[str, Any] = field(default_factory=dict, compare=False)
    refused: str = ""
    gone: bool = False

    @property
    def cache_key(self) -> str:
        # The copy's scheme too: a copy made again in another scheme is written at the same path.
        return f"{self.ref}@{self.path}" + (f"#{self.quantization}" if self.quantization else "")


@dataclass(frozen=True, kw_only=True)
class _Model:
    """A model of the project as the database has it, before its directory is looked at: ``label`` is
    ``before`` + ``name`` + ``after``, ``source`` the directory it was exported to and ``copy_dir`` where
    its serving copy is (``served_model`` picks between them)."""

    ref: str
    before: str
    name: str
    after: str = ""
    source: str
    copy_dir: Path
    created: datetime | None
    archived: bool = False  # its run's: left out of the pickers
    registered: bool = False  # a base model's: its directory, under the models root, judged at each load (load_refusal)
    template_kwargs: dict[str, Any] = field(default_factory=dict, compare=False)  # its run's: _template_kwargs

    @property
    def label(self) -> str:
        return f"{self.before}{self.name}{self.after}"


def _project_models(project: Project) -> list[_Model]:
    """Base models, then runs newest first, each run's final model (if it succeeded) before its exported
    checkpoints, latest step first (not a reward run's: its model scores text, it does not write any).
    Only the columns named are read: the chat, ``/v1`` and the review form ask this on every request, and
    a run's JSON columns (spec, summary) cost more to load than everything else together."""
    models = [_Model(ref=model.public_id, before=BASE_MODEL_LABEL, name=model.name, source=model.path,
                     copy_dir=base_model_copy_dir(model), created=model.created_at, registered=True)
              for model in BaseModel.objects.filter(project=project).order_by("name")
              .only("public_id", "name", "path", "created_at")]
    artifacts = (Artifact.objects.filter(run__project=project, kind__in=["model", "checkpoint"])
                 .exclude(run__task=REWARD_TASK)
                 .order_by("-run__created_at", "run_id", "-kind", "-step")  # kind "model" after "checkpoint"
                 .values_list("kind", "path", "created_at", "run__public_id", "run__name", "run__status",
                              "run__finished_at", "run__created_at", "run__archived",
                              # the variables alone, not the whole spec: _template_kwargs
                              "run__resolved_spec__data__chat_template_kwargs", "run__spec__data__chat_template_kwargs"))
    for (kind, path, created, run_id, run_name, status, finished, run_created, archived, resolved_variables,
         written_variables) in artifacts:
        variables = _template_kwargs(resolved_variables if resolved_variables is not None else written_variables)
        if kind == "model" and status == RunStatus.SUCCEEDED:
            models.append(_Model(ref=run_id, before=RUN_LABEL, name=run_name, source=path,
                                 copy_dir=export_copy_dir(path), created=finished or run_created, archived=archived,
                                 template_kwargs=variables))
        elif kind == "checkpoint" and (match := _CHECKPOINT_DIR.search(path)):
            models.append(_Model(ref=f"{run_id}:step-{match.group(1)}", before=RUN_LABEL, name=run_name,
                                 after=f", checkpoint {match.group(1)}", source=path, copy_dir=export_copy_dir(path),
                                 created=created, archived=archived, template_kwargs=variables))
    return models


def _template_kwargs(variables: Any) -> dict[str, Any]:
    """A run's ``data.chat_template_kwargs`` (as the engine ran it, else as written), which its exports' models are
    chatted with. An export keeps them in its ``chat_template_kwargs.json`` (over its base model's own); one made
    before exports kept them has none, and the engine then reads them from the run's ``spec.yaml`` beside the export:
    the web sends the Run row's with every request for a run's model instead (``ModelChoice.template_kwargs``), so
    that the run directory's spec.yaml, gone or written over, changes nothing."""
    return dict(variables) if isinstance(variables, dict) else {}


def _choice(model: _Model, *, shown_label: str, project: Project, listing: bool) -> ModelChoice:
    """``model`` with what serves it (a look at its copy's directory), ``shown_label``, its label made
    distinct from the project's other models' (``distinct_labels``), and why it may not be loaded, if so
    (``load_refusal``; ``listing``: every model of the project is being listed; or its directory is gone)."""
    refused = (load_refusal(path=model.source, project_slug=project.slug, listing=listing) if model.registered
               else "")
    served = served_model(model.source, model.copy_dir)
    # The directory the serve worker would load (a whole serving copy outlives its source): where it is gone, the
    # worker failed on the missing folder after the conversation, the battle or the completion was made. A model
    # refused already is said in those words alone.
    gone = not refused and model_dir_gone(served.path, listing=listing)
    copy = f" · {served.scheme} serving copy" if served.scheme else ""
    option_label = f"{model.before}{isolated(model.name)}{model.after}{copy}"
    said = [model.ref] if shown_label != model.label else []
    if gone:
        said.append(FOLDER_GONE)  # as the launch form lists it (runs.selectors.model_choices)
    if said:
        option_label = f"{option_label} ({', '.join(said)})"
    return ModelChoice(ref=model.ref, path=served.path, quantization=served.scheme, label=shown_label,
                       option_label=option_label,
                       created=int(model.created.timestamp()) if model.created is not None else 0,
                       template_kwargs=model.template_kwargs, refused=_gone_refusal(model) if gone else refused,
                       gone=gone)


def _gone_refusal(model: _Model) -> str:
    """Why ``model``, its directory deleted since, is not chatted with: in a launch's words
    (``gone_model_words``), with what to do."""
    if model.registered:
        return (f"{gone_model_words(base_model=named_model(model.name, model.ref))}; {REGISTER_AGAIN} and choose it, "
                "or choose another model")
    checkpoint = checkpoint_of(model.ref)
    run_id, step = checkpoint if checkpoint is not None else (model.ref, None)
    return f"{gone_model_words(run=named_model(model.name, run_id), step=step)}; choose another model"


def distinct_labels(labels: dict[str, str]) -> dict[str, str]:
    """``{ref: label}`` with each label that several refs share followed by its ref (two runs of a
    project may have the same name), so that no two models read alike."""
    counts = Counter(labels.values())
    return {ref: f"{label} ({ref})" if counts[label] > 1 else label for ref, label in labels.items()}


def thinking_defaults(choices: list[ModelChoice]) -> dict[str, bool]:
    """The models of ``choices`` whose chat template reads ``enable_thinking`` (Qwen3's switch), by ref, each with
    the switch's default: off where the model's own template variables (``chat_template_kwargs.json``, or for a
    run's model its run's, ``ModelChoice.template_kwargs``: a run that trained with thinking off) set it false, else
    on, as the template renders without it."""
    defaults = {}
    for choice in choices:
        if choice.refused:
            continue
        default = _thinking_default(choice.path, _template_files_stamp(choice.path))
        if default is not None:
            trained = choice.template_kwargs.get("enable_thinking", default)
            defaults[choice.ref] = trained is not False
    return defaults


_TEMPLATE_FILES = ("tokenizer_config.json", "chat_template.jinja", "chat_template_kwargs.json")


def _template_files_stamp(path: str) -> tuple:
    # A model written again at its path (a run exported anew) is read anew: the key of what is read from its files is
    # their stamp (inode, times, size), itself taken at most every few seconds (webapp.core.file_stamps).
    return file_stamps.stamp(path, _TEMPLATE_FILES)


# Unbounded: the pickers ask this of every model of the project, in the same order, on every request. Bounded at 256,
# a project of 300 models (100 base models, 200 exported runs) had each model's entry evicted by the time it was asked
# again, and every load read and parsed every model's tokenizer files. An entry is a path and a few numbers; a new one
# comes only with a new model or its files written anew.
@functools.lru_cache(maxsize=None)
def _thinking_default(path: str, _stamp: tuple) -> bool | None:
    from jaxengine.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplateError, template_variables
    from jaxengine.tokenizer import TokenizerError, read_tokenizer_settings

    try:
        settings = read_tokenizer_settings(path)
        reads = template_variables(settings.chat_template or DEFAULT_CHAT_TEMPLATE)
    except (TokenizerError, ChatTemplateError, OSError):
        return None  # a chat with it says what is wrong with its files
    if "enable_thinking" not in reads:
        return None
    return settings.template_kwargs.get("enable_thinking") is not False


# The Thinking switch's variable (``thinking_defaults``): the chat offers it as that switch, not among the others.
THINKING_VARIABLE = "enable_thinking"
# ``chat_variables``' kind of a variable the template reads as a list or mapping: no chat form offers it.
STRUCTURED = "structured"


@dataclass(frozen=True, kw_only=True)
class TemplateVariable:
    """A variable of a model's chat template that a person may set for a conversation
    (``jaxengine.chat_template.chat_variables``, less the Thinking switch's): ``kind`` "boolean" (the template only
    asks whether it holds) or "text", and the model's own value, ``default`` (its run's over its
    ``chat_template_kwargs.json``, as a turn sends them), where ``has_default``."""

    name: str
    kind: str
    default: Any = None
    has_default: bool = False


def chat_template_variables(choice: ModelChoice) -> dict[str, TemplateVariable]:
    """The variables of ``choice``'s chat template a conversation may set, by name in name order; none where its
    tokenizer files or template cannot be read (a chat with it says what is wrong with them)."""
    found = None if choice.refused else _chat_variables(choice.path, _template_files_stamp(choice.path))
    if found is None:
        return {}
    kinds, own_variables = found
    defaults = {**own_variables, **choice.template_kwargs}
    return {name: TemplateVariable(name=name, kind=kind, default=defaults.get(name), has_default=name in defaults)
            for name, kind in kinds.items() if name != THINKING_VARIABLE and kind != STRUCTURED}


def structured_template_variables(choice: ModelChoice) -> list[str]:
    """The variables ``choice``'s chat template reads as a list or mapping (Llama 3's ``custom_tools``), in name order:
    ``chat_template_variables`` leaves them out, a form's text box being no list; a /v1 request's tools set them."""
    found = None if choice.refused else _chat_variables(choice.path, _template_files_stamp(choice.path))
    return [name for name, kind in found[0].items() if kind == STRUCTURED] if found else []


# Unbounded, as _thinking_default and for its reason: the arena asks this of every model of the project on each load
# (its compare mode's variables); an entry is a few names and values.
@functools.lru_cache(maxsize=None)
def _chat_variables(path: str, _stamp: tuple) -> tuple[dict[str, str], dict[str, Any]] | None:
    from jaxengine.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplateError, chat_variables

    if (settings := _tokenizer_settings(path, _stamp)) is None:
        return None
    try:
        return chat_variables(settings.chat_template or DEFAULT_CHAT_TEMPLATE), dict(settings.template_kwargs)
    except ChatTemplateError:
        return None


@functools.lru_cache(maxsize=256)
def _tokenizer_settings(path: str, _stamp: tuple):
    from jaxengine.tokenizer import TokenizerError, read_tokenizer_settings

    if not Path(path).is_dir():  # gone (the serve worker says so), where reading it would find the defaults
        return None
    try:
        return read_tokenizer_settings(path)
    except (TokenizerError, OSError):
        return None


def rendered_prompt(*, model: ModelChoice, messages: list[dict[str, str]], variables: dict[str, Any]) -> str | None:
    """The text the serve worker renders for ``messages`` as a prompt asking for the next answer (``encode_prompt``,
    before its tokens): the model's chat template with its special tokens, its own variables and ``variables`` (a
    turn's ``chat_template_kwargs``) over them. None where the model's tokenizer files cannot be read or there are no
    messages; ``ChatTemplateError`` (file line and message) where the template fails on them."""
    from jaxengine.chat_template import DEFAULT_CHAT_TEMPLATE, render_chat_template

    if model.refused:
        return None
    settings = _tokenizer_settings(model.path, _template_files_stamp(model.path))
    if settings is None or not messages:
        return None
    return render_chat_template(settings.chat_template or DEFAULT_CHAT_TEMPLATE, messages, add_generation_prompt=True,
                                **{**settings.named_tokens, **settings.template_kwargs, **variables})


@dataclass(frozen=True, kw_only=True)
class EncodedPrompt:
    """The prompt the serve worker encodes for a conversation's next answer, decoded (``text``), and how many of its
    oldest messages it leaves out to fit the model's context (``left_out``)."""

    text: str
    left_out: int


def encoded_prompt(*, model: ModelChoice, messages: list[dict[str, str]], variables: dict[str, Any],
                   max_new_tokens: int) -> EncodedPrompt | None:
    """What the serve worker encodes for ``messages`` (a chat turn's request: ``variables`` its
    ``chat_template_kwargs``, ``max_new_tokens`` its answer's): ``jaxengine.prompts.fitted_conversation``, the worker's
    own way with a conversation past the model's context (``worker.tasks.serve.fit_to_context``), with the BOS token
    it adds, decoded with the special tokens. None where the model's tokenizer cannot be read or there are no messages;
    the whole conversation where its config.json cannot be read (the worker cannot load the model either, and says
    why); ``ChatTemplateError`` where the template fails on them, ``ContextLengthError`` where the last message or the
    system prompt fills the context alone (both say what to do)."""
    import json

    from jaxengine.models.config import served_context
    from jaxengine.prompts import encode_prompt, fitted_conversation

    if model.refused:
        return None
    tokenizer = _tokenizer(model.path, _template_files_stamp(model.path))
    if tokenizer is None or not messages:
        return None
    try:
        hf_config = json.loads((Path(model.path) / "config.json").read_text(encoding="utf-8"))
        context = served_context(hf_config if isinstance(hf_config, dict) else {})
    except (OSError, UnicodeDecodeError, ValueError, TypeError):
        kept, ids = messages, encode_prompt(tokenizer, messages, **variables)
    else:
        kept, ids = fitted_conversation(tokenizer, messages, context=context, max_new_tokens=max_new_tokens,
                                        **variables)
    return EncodedPrompt(text=tokenizer.decode(ids, skip_special_tokens=False), left_out=len(messages) - len(kept))


@functools.lru_cache(maxsize=4)  # a tokenizer of a large vocabulary holds tens of megabytes
def _tokenizer(path: str, _stamp: tuple):
    from jaxengine.tokenizer import TokenizerError, load_tokenizer

    if not Path(path).is_dir():
        return None
    try:
        return load_tokenizer(path)
    except (TokenizerError, OSError):
        return None


def vocabulary_size(model: ModelChoice) -> int | None:
    """The token ids ``model`` takes, as its config.json states them (``served_vocab_size``), read again once the file
    changes; None where it cannot be read (the serve worker, which loads the model, judges the ids then)."""
    if model.refused:
        return None
    return _vocabulary_size(model.path, file_stamps.stamp(model.path, ("config.json",)))


# Unbounded, as _thinking_default and for its reason: an entry is a path, a stamp and a number.
@functools.lru_cache(maxsize=None)
def _vocabulary_size(path: str, _stamp: tuple) -> int | None:
    try:
        hf_config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return served_vocab_size(hf_config) if isinstance(hf_config, dict) else None


def model_choices(*, project: Project, archived: bool = False) -> list[ModelChoice]:
    """The models the project offers to chat with, in ``_project_models``' order: not archived runs'
    (someone put them away; the arena would still draw them) unless ``archived``. ``model_choice``
    still finds those by ref, for the conversations and API clients that use them."""
    models = _project_models(project)
    shown = distinct_labels({model.ref: model.label for model in models})  # as model_choice labels them
    return [_choice(model, shown_label=shown[model.ref], project=project, listing=True) for model in models
            if archived or not model.archived]


def model_choice(*, project: Project, ref: str) -> ModelChoice | None:
    """The model ``ref`` names among the project's, as ``model_choices`` has it; only its own directory is
    looked at (each ``/v1`` request and chat turn asks this). A checkpoint is found by either of its names
    (``run_…:step-N`` as listed here, ``run_…@N`` as a spec and the REST API write it: ``model_refs``)."""
    ref = chat_ref(ref)
    models = _project_models(project)
    model = next((model for model in models if model.ref == ref), None)
    if model is None:
        return None
    shown = distinct_labels({model.ref: model.label for model in models})
    return _choice(model, shown_label=shown[model.ref], project=project, listing=False)


def run_serves_no_model(*, project: Project, ref: str) -> str | None:
    """Why ``ref``, which ``model_choice`` did not find, names no model to chat with, when it names a run of
    ``project`` (a run or one of its checkpoints): still training, ended without an export, a checkpoint not
    exported, a reward model, an external run; None when it names no run here. /v1 said such a run did not exist."""
    run_id, _, step = str(chat_ref(ref)).partition(":step-")
    run = (Run.objects.filter(project=project, public_id=run_id)
           .only("public_id", "name", "task", "status", "current_step", "total_steps").first())
    if run is None:
        return None
    named = f"run {run.public_id} ({isolated(run.name)})"
    address = f"/api/v1/projects/{project.slug}/runs/{run.public_id}/"
    if run.task == EXTERNAL_TASK:
        return f"{named} was trained elsewhere and logged here: Temper holds no model of it"
    if run.task == REWARD_TASK:
        return f"{named} trained a reward model, which scores answers and writes none: there is nothing to chat with"
    if step:
        return f"{named} has no exported checkpoint at step {step}: export it on the run's page (Checkpoints) to chat with it"
    if run.status in ACTIVE_STATUSES:
        progress = f" (step {run.current_step} of {run.total_steps})" if run.status == RunStatus.RUNNING and run.total_steps else ""
        return (f"{named} is {run.status}{progress}: its model is served once the run succeeds; GET {address} says "
                "when it has")
    if run.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        ended = "failed" if run.status == RunStatus.FAILED else "was cancelled"
        return (f"{named} {ended} at step {run.current_step} without exporting a model, so there is nothing to chat "
                f"with: resume it to train on and export one (POST {address}resume/)")
    return None


def unavailable_reason(*, project: Project, conversation: Conversation) -> str:
    """Why the conversation's model is not served now (``model_choice`` found none): the final model of a
    run trained again (resumed), which is back once the run succeeds, or a model gone from the project."""
    label = isolated(conversation.model_label)
    if Run.objects.filter(project=project, public_id=conversation.model_ref, status__in=ACTIVE_STATUSES).exists():
        return f"the model {label} is training again (its run was resumed): the conversation goes on once the run succeeds"
    return f"the model {label} is no longer available in this project"


def conversation_list(*, project: Project, user) -> QuerySet[Conversation]:
    """The user's chat conversations in the project, most recently active first, without those in which
    nothing was ever sent: each Start makes one (its page prepares the model while the person types), and
    a Start left without a message is not a conversation to come back to."""
    return (Conversation.objects.filter(project=project, user=user, in_arena=False)
            .filter(Exists(Message.objects.filter(conversation=OuterRef("pk")))).order_by("-updated_at", "-pk"))


def messages_before(*, conversation: Conversation, answer: Message, count: int) -> list[str]:
    """The public ids of the ``count`` messages of ``conversation`` just before ``answer``, the newest first:
    what a page must show above the answer it is told of (another tab may have taken a turn meanwhile)."""
    return list(conversation.messages.exclude(pk=answer.pk).order_by("-created_at", "-id")
                .values_list("public_id", flat=True)[:count])


def project_slug_of_answer(*, message_id: str) -> str | None:
    """The slug of the project whose conversation holds the chat answer ``message_id``; None when there is no such
    answer (an API completion's id, or a conversation deleted since)."""
    return (Message.objects.filter(public_id=message_id)
            .values_list("conversation__project__slug", flat=True).first())


def may_delete_conversation(*, membership: Membership, conversation: Conversation) -> bool:
    """Only its author, while a member: a conversation is private to them (nobody else even sees it)."""
    return membership.can(Role.MEMBER) and conversation.user_id == membership.user_id


def conversation_readers(*, conversation: Conversation) -> list[str]:
    """What still needs ``conversation`` (what a deletion would break), one sentence each: an arena
    battle it is a side of (its vote counts on the leaderboard and its pair may be exported or reviewed),
    an answer a serve worker is still writing (it would spend the accelerator on an answer nobody reads;
    one no worker will finish any more, ``answer_is_lost``, holds nothing)."""
    from webapp.chat.services import answer_is_lost  # services import this module

    readers = []
    if conversation.in_arena:
        readers.append("it is a side of an arena battle, whose vote the leaderboard counts")
    streaming = conversation.messages.filter(status=MessageStatus.STREAMING)
    if any(not answer_is_lost(message) for message in streaming):
        readers.append("an answer is still being written; stop it or wait for it to finish")
    return readers


def api_generations_answered(*, project_id: int, ref: str | None = None) -> QuerySet[ApiGeneration]:
    """The project's ``/v1`` completions being answered (with the model ``ref``, a base model's id or a run's,
    which covers its checkpoints; any model without it), oldest first. One older than a chat answer is given up
    after (``services.generation_expiry_seconds``) lost its view and holds nothing."""
    from webapp.chat.services import generation_expiry_seconds  # services import this module

    since = timezone.now() - timedelta(seconds=generation_expiry_seconds())
    answered = ApiGeneration.objects.filter(project_id=project_id, created_at__gte=since)
    if ref is not None:
        answered = answered.filter(Q(model_ref=ref) | Q(model_ref__startswith=f"{ref}:"))
    return answered.select_related("user").order_by("created_at", "id")


def answers_being_written(*, project_id: int, ref: str) -> list[str]:
    """The conversations whose answer a serve worker is still writing with the model ``ref`` (a base model's
    id, or a run's, which covers its checkpoints), and the ``/v1`` completions answered with it
    (``api_generations_answered``), one sentence each, for a deletion of that model to refuse: it would pull
    the weights from under the answer. Named by their author and id, not their title, which is private to the
    author. An answer no worker will finish (``answer_is_lost``) holds nothing."""
    from webapp.chat.services import answer_is_lost  # services import this module

    streaming = (Message.objects.filter(conversation__project_id=project_id, status=MessageStatus.STREAMING)
                 .filter(Q(conversation__model_ref=ref) | Q(conversation__model_ref__startswith=f"{ref}:"))
                 .select_related("conversation__user").order_by("created_at", "id"))
    readers: list[str] = []
    for message in streaming:
        if answer_is_lost(message):
            continue
        conversation = message.conversation
        author = isolated(conversation.user.get_username())
        if conversation.in_arena:
            battle = Battle.objects.filter(Q(side_a=conversation) | Q(side_b=conversation)).first()
            sentence = (f"{author}'s arena battle {battle.public_id if battle else conversation.public_id} is being "
                        "answered by its model; wait for the answers to finish")
        else:
            sentence = (f"{author}'s chat conversation {conversation.public_id} is being answered by its model; wait "
                        "for the answer to finish (its author can stop it)")
        if sentence not in readers:
            readers.append(sentence)
    for completion in api_generations_answered(project_id=project_id, ref=ref):
        readers.append(f"{isolated(completion.user.get_username())}'s /v1 completion {completion.public_id} (project "
                       f"token {isolated(completion.token_name)}) is being answered by its model; wait for it to finish")
    return readers
