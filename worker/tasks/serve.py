"""``serve`` queue: one generation (a chat message, an API completion), streamed through Redis.

The serve worker runs Celery's thread pool (``--pool threads --concurrency N``). Each task thread
renders its prompt, submits it to this process's ``jaxengine.serving.BatchingServer`` for its model
and waits; the request joins the batch already decoding at the server's next decode call (continuous
batching), so concurrent conversations share decode steps. Models stay loaded in a ``ModelCache`` bounded by
``TEMPER_SERVE_MEMORY_BYTES`` (least recently used out), and go at once when the web deletes them: a thread
woken by each deletion's announcement (``channels.DELETED_MODELS_CHANNEL``), and every ``DELETED_POLL_SECONDS``
in case its connection lost one, reads the models deleted (``channels.deleted_models``) and drops their weights
and servers, ending with an error the answers still decoding on them (``drop_deleted_models``); otherwise a
deleted model's weights stayed in memory until evicted. Events follow ``webapp.chat.channels``.

A request for ``n`` answers (a ``/v1`` request's ``n``, at most ``MAX_CHOICES``) is one task: its answers are
submitted as one group (``BatchingServer.submit_group``), rows decoded in the same calls, answer i with the seed
``choice_seed(seed, i)``, and each streams as a generation of its own (``_ChoiceEvents``).

An echo (``GenerateRequest.echo``, ``/v1/completions``' ``echo``) sends a ``prompt`` event before the answers' tokens:
the prompt's text (of a prompt sent as token ids, those ids' text: ``echoed_text``) and, with ``logprobs``, its
tokens' log probabilities, scored once on this task's thread
(``jaxengine.serving.BatchDecoder.prompt_logprobs``) however many answers follow; ``max_new_tokens`` 0, which only an
echo may ask, submits no generation.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import queue
import threading
import time
import weakref
from pathlib import Path
from typing import Annotated, Literal

import redis
from celery.signals import celeryd_init, worker_shutdown
from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from jaxengine.chat_template import TEMPLATE_VARIABLES_MAX
from webapp.basemodels.inspection import check_registered_model_dir
from webapp.celery import app
from webapp.chat import channels
from webapp.chat import selectors as chat_selectors
from webapp.chat import services as chat_services
from webapp.runs.channels import REDIS_TIMEOUT_SECONDS, redis_client

logger = logging.getLogger(__name__)

STOP_POLL_SECONDS = 0.1  # how often a generation reads its stop flag (not once per token)
DEFAULT_MAX_NEW_TOKENS = 256  # a request that does not say how many
DELETED_POLL_SECONDS = 5.0  # how often the models deleted in the web are looked for unannounced (one Redis read)
MODEL_DELETED = "the model was deleted while this answer was being written; choose another model"
LOADING = "loading the model: its first answer since the serve worker started"
# Said until the first token where the model's programs may not be compiled yet: its time limit starts after.
COMPILING = ("compiling the model's programs: its first answers since the serve worker started wait for it; "
             "the answer's time limit starts once they are compiled")

_events_clients: dict[str, redis.Redis] = {}  # REDIS_URL -> the client every generation of this process shares
_events_clients_lock = threading.Lock()


def events_client() -> redis.Redis:
    """One client, a thread-safe pool of connections, for the generations of this process: a client per
    generation connected and handshook anew for each (and redis-py 8 read its package metadata for each
    connection: 6 % of a busy serve worker's time holding the GIL at 16 concurrent chats)."""
    url = settings.REDIS_URL
    with _events_clients_lock:
        if url not in _events_clients:
            _events_clients[url] = redis_client()
        return _events_clients[url]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class GenerateRequest(BaseModel):
    """What the web sends: the generation id, the model (a cache key and its directory, and the project asking), one
    of a conversation (rendered with the model's chat template), a raw ``prompt`` or the prompt's token ids
    (``prompt_token_ids``, decoded as they are), and sampling settings."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=100)
    # A chat message (``webapp.chat``) whose row receives the outcome; None for API completions.
    message: str | None = None
    model_key: str = Field(min_length=1)
    model_path: str = Field(min_length=1)
    # The project asking, whose slug judges model_path before it is read (check_registered_model_dir).
    project_slug: str = Field(min_length=1, max_length=100)
    messages: list[Message] | None = None
    # Variables for the model's chat template over the model's own (chat_template_kwargs.json): a /v1 request's
    # chat_template_kwargs, a conversation's Thinking switch. Checked by jaxengine.chat_template.template_variable_problem.
    # A run's model sends its Run row's (a spec's, at most TEMPLATE_VARIABLES_MAX) under the request's own (as many).
    chat_template_kwargs: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict, max_length=2 * TEMPLATE_VARIABLES_MAX)
    prompt: str | None = None
    # /v1/completions' prompt sent as token ids (lm-evaluation-harness's default): exactly the prompt's tokens, no BOS
    # added, never detokenized and tokenized again; ids past the model's vocabulary are the engine's PromptError.
    prompt_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, min_length=1)
    # None (an API request without max_tokens): up to DEFAULT_MAX_NEW_TOKENS, fewer where the prompt leaves less
    # room in the context, as OpenAI's and vLLM's servers fill the context rather than refuse. 0 (with echo only):
    # nothing generated, the prompt scored.
    max_new_tokens: int | None = Field(default=None, ge=0, le=8192)
    temperature: float = Field(default=0.7, ge=0.0, le=5.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=2**31 - 1)  # jaxengine.sampler.TOP_K_MAX: an int32 a row
    seed: int = Field(default=0, ge=0, lt=2**32)
    # OpenAI's (jaxengine.sampler.SamplingParams): penalties of tokens already generated, and a bias by token id.
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[int, Annotated[float, Field(ge=-100.0, le=100.0)]] = Field(default_factory=dict, max_length=1024)
    # Text that ends the generation where it first appears (cut before it), as OpenAI's ``stop``.
    stop: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list, max_length=4)
    # Log probabilities of each token and of this many alternatives (jaxengine.serving.LOGPROBS_MAX); None: none.
    logprobs: int | None = Field(default=None, ge=0, le=20)
    # /v1/completions' echo: a ``prompt`` event (the prompt's text, and with logprobs its tokens' log probabilities,
    # jaxengine.serving.BatchDecoder.prompt_logprobs) before the answer's tokens, and the done event's prompt_logprobs.
    echo: bool = False
    timeout_seconds: float = Field(default_factory=lambda: float(settings.TEMPER_SERVE_TIMEOUT_SECONDS), gt=0,
                                   le=3600)
    # The chat panel's way with the context (``fit_to_context``): leave out the oldest turns, then generate
    # only what still fits, instead of refusing. The API refuses, as OpenAI's does.
    fit_context: bool = False
    # Answers to sample (a /v1 request's n): rows decoded together, each its own generation (channels.choice_id).
    n: int = Field(default=1, ge=1, le=chat_services.MAX_CHOICES)

    @model_validator(mode="after")
    def _something_to_answer(self):
        if self.max_new_tokens == 0 and not self.echo:
            raise ValueError("max_new_tokens: 0 generates nothing; send it only with echo (the prompt scored)")
        if self.echo and self.messages is not None:
            raise ValueError("echo: a conversation's rendered prompt is not echoed; send echo with a prompt")
        return self

    @model_validator(mode="after")
    def _one_answer_for_a_chat_message(self):
        if self.message is not None and self.n != 1:
            raise ValueError("n: a chat message's row holds one answer; send n 1 with a message")
        return self

    @model_validator(mode="after")
    def _one_prompt(self):
        if [self.messages, self.prompt, self.prompt_token_ids].count(None) != 2:
            raise ValueError("give exactly one of messages (a conversation), prompt (raw text) or prompt_token_ids")
        if self.messages is not None and not self.messages:
            raise ValueError("messages: the conversation is empty")
        from jaxengine.chat_template import template_variable_problem

        for name, value in self.chat_template_kwargs.items():
            if problem := template_variable_problem(name, value):
                raise ValueError(f"chat_template_kwargs: {problem}")
        return self


_lock = threading.Lock()
_cache = None
_servers: dict = {}  # model key -> BatchingServer, for the models in _cache
_server_models: dict = {}  # model key -> the LoadedModel its server decodes
_devices: list = []  # what each model's batches split their rows over (jaxengine.serving.serving_devices)
_deleted_servers: weakref.WeakSet = weakref.WeakSet()  # servers dropped because their model was deleted
_answering_servers: weakref.WeakSet = weakref.WeakSet()  # servers that gave some answer its first token
_watcher: threading.Thread | None = None  # runs _watch_deleted_models once a model is loaded
_watcher_stopping = threading.Event()  # set by shutdown(); a new one for each watcher


_devices_lock = threading.Lock()


def configure_devices() -> list:
    """This process's serving devices (``jaxengine.serving.serving_devices``: on CPU, one host device per
    core, ``TEMPER_SERVE_CPU_DEVICES``), asked of JAX once, before this process's first JAX work."""
    global _devices
    with _devices_lock:
        if not _devices:
            from jaxengine.serving import serving_devices

            _devices = serving_devices(settings.TEMPER_SERVE_CPU_DEVICES or None)
        return _devices


@celeryd_init.connect
def configure_serve_worker(sender=None, options=None, **kwargs) -> None:
    """A worker consuming the ``serve`` queue asks for its devices as it starts: its first JAX work may be
    a serving copy (``quantize_run``) rather than a chat, and would start JAX with one host device."""
    queues = (options or {}).get("queues") or []
    if isinstance(queues, str):
        queues = queues.split(",")
    if "serve" in queues:
        configure_devices()


def server_for(key: str, path: str):
    """The batching server of a cached model (loading it, and closing servers of models evicted or loaded
    again); chats and review campaigns share it, so a model is loaded once per serve process. A new server
    compiles a lone conversation's programs, then concurrent conversations', then an echo's prompt scoring, in its
    idle time (``TEMPER_SERVE_WARMUP``)."""
    global _cache
    from jaxengine.serving import BatchDecoder, BatchingServer, ModelCache, devices_for_model

    devices = configure_devices()  # before the first model loads, while JAX can still be given devices
    with _lock:
        if _cache is None:
            _cache = ModelCache(budget_bytes=settings.TEMPER_SERVE_MEMORY_BYTES)
        _start_watching_deleted_models()
        loaded = _cache.get(key, path)
        # Evicted, or loaded again (a resumed run exported anew at the same path): answers already decoding
        # end on the weights they began with, the next ones start on the new.
        closed = []
        for stale in [stale for stale in _servers if _server_models[stale] is not _cache.peek(stale)]:
            closed.append(_servers.pop(stale))
            closed[-1].close(wait=False)
            del _server_models[stale]
        loading = key not in _servers
        if loading:
            decoder = BatchDecoder(loaded.model, loaded.tokenizer, devices=devices_for_model(devices, loaded.nbytes))
            _servers[key] = BatchingServer(decoder)
            _server_models[key] = loaded
            if settings.TEMPER_SERVE_WARMUP:
                _servers[key].warm(decoder.warmup())
        _forget_programs_of(closed)  # after the new server: a model loaded again keeps its structure's programs
        server = _servers[key]
    if loading:
        drop_retired_programs_past_high_water()
    return server, loaded.tokenizer


def _forget_programs_of(closed: list, *, retire: bool = True) -> None:
    """The compiled programs of the closed servers' model structures that no server left uses are kept no longer as
    in use: among the last few retired (``retire``: an evicted model a user may come back to) or, for deleted
    models, not at all; they go with the last answer decoding on them. Kept, every structure a long-lived worker
    served held its programs, each with memory maps of its own, towards the process's limit (vm.max_map_count),
    where XLA's compiler segfaults (bench/RESULTS.md, "The serve worker's compiled programs"). Called holding
    ``_lock``."""
    from jaxengine.serving import forget_programs

    in_use = {id(server.decoder.compiled) for server in _servers.values()}
    for server in closed:
        if id(server.decoder.compiled) not in in_use:
            forget_programs(server.decoder, retire=retire)


def memory_maps() -> int | None:
    """This process's memory maps (lines of /proc/self/maps: 58 ms for 25,000 on a loaded 2-core machine, against a
    model load's seconds); None where there is no /proc."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return None


def drop_retired_programs_past_high_water() -> int:
    """Past ``TEMPER_SERVE_MAPS_HIGH_WATER`` memory maps, drop the compiled programs of every model structure retired
    (kept for a user going back to an evicted model: ``jaxengine.programs``) and say so in the log; returns how many
    structures' went. A safety net under the bounds on what is held (models in the cache, the last few retired, none
    of an export's after it): the maps of programs still running, a model's very long context, or a bound set too
    high must not take the process to vm.max_map_count, where XLA's compiler segfaults mid-chat. Called after a model
    loads (``server_for``, the serving copies' tasks)."""
    import gc

    from jaxengine.programs import PROGRAMS

    high_water = settings.TEMPER_SERVE_MAPS_HIGH_WATER
    before = memory_maps()
    if before is None or before <= high_water:
        return 0
    dropped = PROGRAMS.drop_retired()
    gc.collect()  # a holder and its jitted methods form a cycle: freed now, not at the collector's next turn
    logger.warning("memory maps %d past the high-water mark %d (TEMPER_SERVE_MAPS_HIGH_WATER; vm.max_map_count is "
                   "where XLA's compiler segfaults): dropped the compiled programs of %d retired model structures, "
                   "%s maps now", before, high_water, dropped, memory_maps())
    return dropped


def programs_compiled(server) -> bool:
    """Whether ``server``'s programs for a lone conversation are compiled: it gave an answer its first token, or its
    warm-up (``TEMPER_SERVE_WARMUP``) is done. Until then an answer waits for compiles (a minute and more for a
    fresh serve worker on a loaded CPU), which its page says in place of the first token."""
    return server in _answering_servers or (bool(settings.TEMPER_SERVE_WARMUP) and server.warmed.is_set())


def model_ref(key: str) -> str:
    """The run or base model a cache key serves: ``run_…:step-N@<path>#int8`` → ``run_…``."""
    return key.split("@", 1)[0].split(":", 1)[0]


def drop_deleted_models(deleted: set[str] | None = None) -> list[str]:
    """Drop the cached weights and batching servers of the models ``deleted`` (by default, those the web
    named: ``channels.deleted_models``); the answers still decoding on them stop at their next decode call
    and end with ``MODEL_DELETED``. Returns the cache keys dropped."""
    if deleted is None:
        deleted = channels.deleted_models(events_client())
    with _lock:
        if _cache is None:
            return []
        dropped = sorted(key for key in {*_cache.keys, *_servers} if model_ref(key) in deleted)
        closed = []
        for key in dropped:
            _cache.discard(key)
            if (server := _servers.pop(key, None)) is not None:
                _deleted_servers.add(server)
                server.close(wait=False)
                closed.append(server)
                del _server_models[key]
        _forget_programs_of(closed, retire=False)
    for key in dropped:
        logger.info("model %s was deleted: its weights and server are dropped", key)
    return dropped


WATCHER_CLIENT_NAME = "temper-deleted-models"  # its connections in Redis's CLIENT LIST


def _watch_deleted_models(*, stopping: threading.Event | None = None) -> None:
    # The watcher's own client (two connections: its subscription and its reads), not the generations' pool:
    # a read taken from that pool while a generation held its connection made the pool connect anew.
    # An outage is logged as it starts and as it ends, not at each try (every DELETED_POLL_SECONDS).
    subscription, watching, redis_away = None, None, False  # watching: (the Redis URL, its client)
    while stopping is None or not stopping.is_set():
        try:
            if watching is None or watching[0] != settings.REDIS_URL:
                if subscription is not None:
                    subscription.reset()
                    subscription = None
                watching = (settings.REDIS_URL, redis.Redis.from_url(
                    settings.REDIS_URL, client_name=WATCHER_CLIENT_NAME, socket_timeout=REDIS_TIMEOUT_SECONDS,
                    socket_connect_timeout=REDIS_TIMEOUT_SECONDS))
            if subscription is None:
                subscription = watching[1].pubsub()
                subscription.subscribe(channels.DELETED_MODELS_CHANNEL)
            # Returns on an announcement (or the subscription's confirmation) at once, else after the poll's time.
            subscription.get_message(timeout=DELETED_POLL_SECONDS)
            drop_deleted_models(channels.deleted_models(watching[1]))
            if redis_away:
                redis_away = False
                logger.info("the models deleted are read from Redis again")
        except redis.RedisError as error:
            if not redis_away:
                redis_away = True
                logger.warning("the models deleted could not be read from Redis: %s (logged once until it is "
                               "back; tried again every %g s)", error, DELETED_POLL_SECONDS)
            if subscription is not None:
                subscription.reset()  # subscribed again, on a new connection, at the next turn
                subscription = None
            time.sleep(DELETED_POLL_SECONDS)
        except Exception:
            logger.exception("dropping deleted models failed")
            time.sleep(DELETED_POLL_SECONDS)


def _start_watching_deleted_models() -> None:
    global _watcher, _watcher_stopping
    if _watcher is None:
        _watcher_stopping = threading.Event()
        _watcher = threading.Thread(target=_watch_deleted_models, name="deleted-models", daemon=True,
                                    kwargs={"stopping": _watcher_stopping})
        _watcher.start()


@worker_shutdown.connect
def shutdown(sender=None, **kwargs) -> None:
    """Close this process's batching servers, forget its cached models (and their compiled programs, the retired
    ones too) and stop the watching thread: a serve worker shutting down (its pool of threads has finished its
    answers by then), or a test process done with the module, whose servers' loops would otherwise idle on as
    threads beside every later test. The threads end at their next turn (the watcher within
    ``DELETED_POLL_SECONDS``), not waited for here."""
    from jaxengine.programs import PROGRAMS

    global _cache, _watcher
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
        _server_models.clear()
        _cache = None
        _watcher = None
        _watcher_stopping.set()
        _forget_programs_of(servers, retire=False)
        PROGRAMS.drop_retired()
    for server in servers:
        server.close(wait=False)


@app.task(name="worker.tasks.serve.prepare")
def prepare(model_key: str, model_path: str, project_slug: str | None = None) -> dict:
    """Load a model a person is about to talk to (a conversation just opened) for project ``project_slug``, so that
    its first answer finds it loaded and, with ``TEMPER_SERVE_WARMUP``, compiling or compiled. A model that cannot
    load, or may not for that project (``check_registered_model_dir``), is only logged: the answer that needs it
    reports the error to the person. A message without a project (sent before it was named) loads nothing."""
    try:
        if not project_slug:
            raise ValueError("no project named; the model is loaded by its first answer")
        check_registered_model_dir(model_path, models_root=settings.MODELS_ROOT, project_slug=project_slug)
        server_for(model_key, model_path)
    except Exception as error:
        logger.warning("model %s (%s) not prepared: %s", model_key, model_path, error)
        return {"error": str(error)}
    return {"loaded": model_key}


def prompt_ids(request: GenerateRequest, tokenizer) -> tuple[int, ...]:
    """The request's prompt as token ids: a conversation rendered exactly as SFT renders prompts, a text with the
    model's BOS before it, token ids as they were sent."""
    from jaxengine.prompts import encode_prompt, with_bos

    if request.prompt_token_ids is not None:
        return tuple(request.prompt_token_ids)
    if request.messages is not None:
        return tuple(encode_prompt(tokenizer, [message.model_dump() for message in request.messages],
                                   **request.chat_template_kwargs))
    return tuple(with_bos(tokenizer, tokenizer.encode(request.prompt)))


def fit_to_context(request: GenerateRequest, tokenizer, context: int) -> tuple[tuple[int, ...], int]:
    """(prompt ids, max new tokens) for the request within ``context`` tokens. A request that does not say
    how many new tokens gets what the context leaves after its prompt, up to ``DEFAULT_MAX_NEW_TOKENS``. One
    that says without ``fit_context`` is taken as it is (the server refuses one that does not fit). With
    it, as chat panels do, a conversation whose prompt and answer would overflow leaves out its oldest turns
    (``jaxengine.prompts.fitted_conversation``, which the conversation page shows the prompt of too) and the answer
    gets what room is left; a last message that fills the context alone is refused, naming its length, or the system
    prompt when no message would fit after it."""
    from jaxengine.prompts import ContextLengthError, fitted_conversation

    ids = prompt_ids(request, tokenizer)
    if request.max_new_tokens is None:
        if len(ids) >= context:
            raise ContextLengthError(f"the prompt ({len(ids)} tokens) fills the model's context ({context} tokens) on "
                                     "its own; send a shorter one")
        return ids, min(DEFAULT_MAX_NEW_TOKENS, context - len(ids))
    if not request.fit_context or len(ids) + request.max_new_tokens <= context:
        return ids, request.max_new_tokens
    if request.messages is not None:
        _kept, fitted = fitted_conversation(tokenizer, [message.model_dump() for message in request.messages],
                                            context=context, max_new_tokens=request.max_new_tokens,
                                            **request.chat_template_kwargs)
        ids = tuple(fitted)
    elif len(ids) >= context:
        raise ContextLengthError(f"the prompt ({len(ids)} tokens) fills the model's context ({context} tokens) on "
                                 "its own; send a shorter one")
    return ids, min(request.max_new_tokens, context - len(ids))


def _token_json(tokenizer, token_id: int, logprob: float) -> dict:
    """One token as OpenAI's chat ``logprobs`` name it: its text (``bytes:\\xNN...`` for part of a character, as
    OpenAI writes it), its UTF-8 bytes and its log probability."""
    raw = tokenizer.token_bytes(token_id)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)
    # A token the model gives no chance at all (-inf) gets OpenAI's stand-in: JSON has no infinity.
    return {"token": text, "bytes": list(raw), "logprob": logprob if math.isfinite(logprob) else -9999.0}


def logprobs_json(tokenizer, logprobs) -> list[dict]:
    """``jaxengine.serving.TokenLogprobs`` as the entries of OpenAI's chat ``logprobs.content``: each token's
    ``token``, ``bytes``, ``logprob`` and its ``top_logprobs`` alike (what events carry; the web shapes them for
    its endpoints)."""
    return [{**_token_json(tokenizer, entry.token_id, entry.logprob),
             "top_logprobs": [_token_json(tokenizer, token_id, value) for token_id, value in entry.top]}
            for entry in logprobs]


def prompt_logprobs_json(tokenizer, prompt_ids, logprobs) -> list[dict]:
    """The prompt's tokens as ``logprobs_json`` entries, its first with ``logprob`` and ``top_logprobs`` null (no
    token comes before it to predict it, as OpenAI's and vLLM's echo give it), the others' from ``logprobs``
    (``jaxengine.serving.BatchDecoder.prompt_logprobs``)."""
    first = {**_token_json(tokenizer, prompt_ids[0], 0.0), "logprob": None, "top_logprobs": None}
    return [first, *logprobs_json(tokenizer, logprobs)]


def token_fields(tokenizer, tokens: int, delta: str, logprobs) -> dict:
    """A ``token`` event's fields for a server callback's tokens (``logprobs`` only where the request asked)."""
    named = {} if logprobs is None else {"logprobs": logprobs_json(tokenizer, logprobs)}
    return {"text": delta, "tokens": tokens, **named}


def done_fields(tokenizer, result, prompt: dict | None = None) -> dict:
    """A ``done`` event's fields for a ``ServeResult``; its log probabilities whole, as the text (an answer read at
    its end does not depend on token events), where the request asked; with ``prompt`` (an echo's ``prompt`` event
    fields), the prompt's text (``prompt_text``) and its log probabilities (``prompt_logprobs``), where they were
    asked."""
    done = {"text": result.text, "finish_reason": result.finish_reason, "prompt_tokens": result.prompt_tokens,
            "completion_tokens": len(result.token_ids), "first_token_seconds": result.first_token_seconds}
    if result.logprobs is not None:
        done["logprobs"] = logprobs_json(tokenizer, result.logprobs)
    if prompt is not None:  # a whole answer's echo reads the prompt's text here: token ids have none of their own
        done["prompt_text"] = prompt["text"]
    if prompt is not None and "logprobs" in prompt:
        done["prompt_logprobs"] = prompt["logprobs"]
    return done


def echo_fields(parsed: GenerateRequest, server, tokenizer, ids: tuple[int, ...]) -> dict:
    """The ``prompt`` event of an echo: the prompt's text (``echoed_text``) and, where log probabilities were asked
    for, its tokens' (``prompt_logprobs_json``), scored once however many answers follow; ``PromptError`` for a prompt
    the model cannot take."""
    if parsed.logprobs is None:
        server.decoder.check_prompt(ids, new_tokens=0)
        return {"text": echoed_text(parsed, tokenizer, ids), "tokens": len(ids)}
    scored = server.decoder.prompt_logprobs(ids, alternatives=parsed.logprobs)
    return {"text": echoed_text(parsed, tokenizer, ids), "tokens": len(ids),
            "logprobs": prompt_logprobs_json(tokenizer, ids, scored)}


def echoed_text(parsed: GenerateRequest, tokenizer, ids: tuple[int, ...]) -> str:
    """An echo's text: the prompt as sent, or the text of the token ids sent, special tokens included, since they
    are prompt tokens as any other (their entries' ``token`` name them, and ``text_offset`` counts them)."""
    if parsed.prompt is not None:
        return parsed.prompt
    return tokenizer.decode(ids, skip_special_tokens=False)


def nothing_generated(ids: tuple[int, ...], *, logprobs: bool):
    """The ``ServeResult`` of a request for no new tokens (an echo's ``max_tokens: 0``): ended by its length."""
    from jaxengine.serving import ServeResult

    return ServeResult(text="", token_ids=[], prompt_tokens=len(ids), finish_reason="length",
                       first_token_seconds=None, logprobs=[] if logprobs else None)


class _Events:
    """Numbered events of one generation; a Redis hiccup loses live tokens, never the generation.

    Every Redis call happens on the task's own thread (``relay``), never on the batching server's: a
    token event is a Redis round trip (about 0.2 ms), and 16 chats' tokens emitted from the server's
    loop would stall the decoding of all of them for as long as it decodes. One ``token`` event carries
    the tokens the server streams in one callback (a decode call's, read back at one moment, so none waits
    for another): a wake-up here, a Redis round trip, an SSE message in the web and a chunk for the client
    are paid per call, not per token. A relay behind the server still sends one event per callback, never
    merging calls, so a page sees an answer grow call by call however busy the machine is.
    """

    def __init__(self, client: redis.Redis, generation_id: str):
        self.client = client
        self.generation_id = generation_id
        self.seq = 0
        self.stopped = False  # the stop flag as last read; the server's thread reads it between decode calls
        # (tokens, their text, their TokenLogprobs or None) of each callback of the server; None: the end
        self._reads: queue.SimpleQueue[tuple[int, str, list | None] | None] = queue.SimpleQueue()
        self.tokenizer = None  # set once the model is loaded: it names the tokens of log probabilities

    def emit(self, event_type: str, *, read_stop: bool = False, **fields) -> None:
        """Send the next event; ``read_stop``: read the stop flag in the same round trip."""
        try:
            stopped = channels.emit(self.client, self.generation_id, {"seq": self.seq, "type": event_type, **fields},
                                    read_stop=read_stop)
            self.stopped = self.stopped or bool(stopped)
        except redis.RedisError as error:
            logger.warning("generation %s: event not sent to Redis: %s", self.generation_id, error)
        self.seq += 1

    def earlier_delivery(self) -> str | None:
        """What an earlier delivery of this generation left: None (this is the first, one whose worker died before
        its first token, or Redis cannot tell), ``"finished"`` (its last event ends it) or ``"lost"`` (its worker
        died mid-answer, and the reapers queued the message again: ``webapp.workers.deliveries``). Numbering goes
        on after its events."""
        try:
            stored = channels.stored_events(self.client, self.generation_id)
        except redis.RedisError:
            return None
        if not stored:
            return None
        self.seq = max(event.get("seq", -1) for event in stored) + 1
        if stored[-1].get("type") in channels.TERMINAL_TYPES:
            return "finished"
        return "lost" if any(event.get("type") in ("token", "prompt") for event in stored) else None

    def on_tokens(self, token_ids: list[int], delta: str, logprobs: list | None = None) -> None:
        self._reads.put((len(token_ids), delta, logprobs))

    def read_stop_flag(self) -> None:
        try:
            self.stopped = self.stopped or bool(self.client.exists(channels.stop_key(self.generation_id)))
        except redis.RedisError:
            pass

    def relay(self, future) -> None:
        """Until ``future`` is done: emit the tokens the server queues, and read the stop flag every
        ``STOP_POLL_SECONDS``."""
        future.add_done_callback(lambda _: self._reads.put(None))  # runs after the request's last tokens
        stop_checked_at = time.monotonic()
        while True:
            try:
                read = self._reads.get(timeout=max(STOP_POLL_SECONDS, 0.01))
            except queue.Empty:
                read = ()
            now = time.monotonic()
            stop_due = not self.stopped and now - stop_checked_at >= STOP_POLL_SECONDS
            if stop_due:
                stop_checked_at = now
            if read is None:
                return
            if read:  # the flag is read with the tokens' event while tokens flow: one round trip for both
                self.emit("token", read_stop=stop_due, **token_fields(self.tokenizer, *read))
            elif stop_due:
                self.read_stop_flag()


def choice_seed(seed: int, index: int) -> int:
    """The engine seed of answer ``index`` of a request for several with ``seed``: the request's own for the first (so
    its first answer is the one a request for one draws), then one derived by a hash, so that the answers draw apart,
    the same seed always draws the same answers, and answer 1 of seed s is not answer 0 of seed s + 1 (as adding
    would make it)."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big")


class _ChoiceEvents:
    """The events of a request's ``n`` answers (``GenerateRequest.n`` > 1): each answer a generation of its own id
    (``channels.choice_id``) with its tokens and ``done``; a ``status`` or an ``error`` (the request's: a prompt
    over the context, a model that failed) goes to every one. A stop asked for the request or any of its answers
    stops them all, and one relay thread sends every answer's tokens (``relay``)."""

    def __init__(self, client: redis.Redis, generation_id: str, n: int):
        self.client = client
        self.generation_id = generation_id
        self.choices = [_Events(client, channels.choice_id(generation_id, index)) for index in range(n)]
        self._stopped = False
        self._ended: set[int] = set()  # answers an earlier delivery ended (earlier_delivery): they get no more events
        # (answer, (tokens, their text, their log probabilities or None)) of each callback of the server;
        # (answer, None): that answer's end
        self._reads: queue.SimpleQueue[tuple[int, tuple[int, str, list | None] | None]] = queue.SimpleQueue()
        self.tokenizer = None  # set once the model is loaded (logprobs_json names tokens with it)

    @property
    def stopped(self) -> bool:
        return self._stopped or any(choice.stopped for choice in self.choices)

    def emit(self, event_type: str, **fields) -> None:
        for index, choice in enumerate(self.choices):
            if index not in self._ended:
                choice.emit(event_type, **fields)

    def earlier_delivery(self) -> str | None:
        """``_Events.earlier_delivery`` of the whole request: ``"finished"`` once every answer ended, ``"lost"``
        once one has tokens or ended and another did not (its worker died mid-request: its ``WORKER_LOST`` error
        then goes to the answers not ended, a reader of an ended one having stopped at its end)."""
        deliveries = [choice.earlier_delivery() for choice in self.choices]
        self._ended = {index for index, delivery in enumerate(deliveries) if delivery == "finished"}
        if all(delivery == "finished" for delivery in deliveries):
            return "finished"
        return "lost" if any(delivery is not None for delivery in deliveries) else None

    def read_stop_flag(self) -> None:
        keys = [channels.stop_key(self.generation_id), *(channels.stop_key(choice.generation_id)
                                                          for choice in self.choices)]
        try:
            self._stopped = self._stopped or bool(self.client.exists(*keys))
        except redis.RedisError:
            pass

    def on_tokens(self, index: int, token_ids: list[int], delta: str, logprobs: list | None = None) -> None:
        self._reads.put((index, (len(token_ids), delta, logprobs)))

    def relay(self, futures: list) -> None:
        """Until every answer's future is done: emit each answer's tokens as the server queues them, and read the
        stop flags every ``STOP_POLL_SECONDS`` (one round trip for them all)."""
        for index, future in enumerate(futures):
            future.add_done_callback(lambda _, index=index: self._reads.put((index, None)))
        going, stop_checked_at = len(futures), time.monotonic()
        while going:
            try:
                index, read = self._reads.get(timeout=max(STOP_POLL_SECONDS, 0.01))
            except queue.Empty:
                index, read = None, ()
            if index is not None and read is None:
                going -= 1
            elif read:
                self.choices[index].emit("token", **token_fields(self.tokenizer, *read))
            if not self.stopped and time.monotonic() - stop_checked_at >= STOP_POLL_SECONDS:
                stop_checked_at = time.monotonic()
                self.read_stop_flag()


def _generate_choices(events: _ChoiceEvents, server, serve_request, *, compiling: bool) -> list:
    """The ``ServeResult`` of each of ``events``' answers to ``serve_request``: submitted as one group
    (``BatchingServer.submit_group``), so they decode as rows of the same calls, each with its seed
    (``choice_seed``); the request's stop, timeout and deadline are every answer's."""
    requests = [dataclasses.replace(serve_request, params=dataclasses.replace(
        serve_request.params, seed=choice_seed(serve_request.params.seed, index)))
        for index in range(len(events.choices))]
    futures = server.submit_group(requests, on_tokens=events.on_tokens,
                                  should_stop=lambda: events.stopped or server in _deleted_servers)
    if compiling:
        events.emit("status", message=COMPILING)
    events.relay(futures)
    return [future.result() for future in futures]


def _events_of(request, generation_id: str) -> _Events | _ChoiceEvents:
    """The events of ``request``: of its one answer, or of each of its ``n`` (an ``n`` out of bounds is refused by
    its validation, as one answer's error)."""
    n = request.get("n", 1) if isinstance(request, dict) else 1
    if isinstance(n, int) and not isinstance(n, bool) and 1 < n <= chat_services.MAX_CHOICES:
        return _ChoiceEvents(events_client(), generation_id, n)
    return _Events(events_client(), generation_id)


def _choices_done(events: _ChoiceEvents, results: list, server, request, prompt: dict | None) -> dict:
    """Emit each answer's ``done`` (its ``choice`` numbered); a request whose model was deleted under it fails."""
    if any(result.first_token_seconds is not None for result in results):
        _answering_servers.add(server)
    if not events.stopped and server in _deleted_servers and any(
            result.finish_reason == "cancelled" for result in results):
        return _fail(events, request, MODEL_DELETED)
    dones = []
    for index, (choice, result) in enumerate(zip(events.choices, results)):
        dones.append({**done_fields(events.tokenizer, result, prompt), "choice": index})
        choice.emit("done", **dones[-1])
    return {"choices": dones}


@app.task(name="worker.tasks.serve.generate")
def generate(request: dict) -> dict:
    """Generate for ``request`` (a ``GenerateRequest`` as a dict), streaming events to Redis; returns the
    ``done`` event's fields, or ``{"error": ...}``."""
    generation_id = str(request.get("id", "")) if isinstance(request, dict) else ""
    events = _events_of(request, generation_id)
    earlier = events.earlier_delivery()
    if earlier == "finished":  # delivered again after its answer was written (its acknowledgement lost)
        return {}
    if earlier == "lost":
        return _fail(events, request, WORKER_LOST)
    try:  # an engine that cannot load ends the answer with that error instead of leaving it streaming
        from jaxengine.sampler import ContextLengthError, PromptError, SamplingParams
        from jaxengine.serving import ServeRequest
    except Exception as error:
        logger.exception("generation %s: the engine did not load", generation_id)
        return _fail(events, request, f"the serve worker could not load the engine: {error}")
    try:
        parsed = GenerateRequest.model_validate(_with_asking_project(request))
        check_registered_model_dir(parsed.model_path, models_root=settings.MODELS_ROOT,
                                   project_slug=parsed.project_slug)
        if parsed.model_key not in _servers:  # a page shows it in place of the first token, for as long as it takes
            events.emit("status", message=LOADING)
        server, tokenizer = server_for(parsed.model_key, parsed.model_path)
        events.tokenizer = tokenizer
        ids, max_new_tokens = fit_to_context(parsed, tokenizer, server.decoder.model.config.max_position_embeddings)
        prompt = None
        if parsed.echo:  # before the answer's tokens, as vLLM streams it
            prompt = echo_fields(parsed, server, tokenizer, ids)
            events.emit("prompt", **prompt)
        if max_new_tokens == 0:  # an echo's max_tokens 0: the prompt alone
            result = nothing_generated(ids, logprobs=parsed.logprobs is not None)
            if isinstance(events, _ChoiceEvents):
                return _choices_done(events, [result] * parsed.n, server, request, prompt)
            done = done_fields(tokenizer, result, prompt)
            events.emit("done", **done)
            return done
        compiling = not programs_compiled(server)
        # The answer's own time starts once its programs are compiled (ServeRequest.time_limit); the wait for that,
        # and for a free row, has a bound of its own, which the web's generation_expiry_seconds counts in.
        serve_request = ServeRequest(
            prompt_ids=ids, time_limit=parsed.timeout_seconds, logprobs=parsed.logprobs,
            deadline=time.monotonic() + chat_services.FIRST_TOKEN_WAIT_SECONDS + parsed.timeout_seconds,
            params=SamplingParams(max_new_tokens=max_new_tokens, temperature=parsed.temperature,
                                  top_p=parsed.top_p, top_k=parsed.top_k, seed=parsed.seed,
                                  stop_strings=tuple(parsed.stop), presence_penalty=parsed.presence_penalty,
                                  frequency_penalty=parsed.frequency_penalty, logit_bias=parsed.logit_bias))
        events.read_stop_flag()  # a stop before the request reaches the server ends it before its first token
        if isinstance(events, _ChoiceEvents):
            return _choices_done(events, _generate_choices(events, server, serve_request, compiling=compiling),
                                 server, request, prompt)
        future = server.submit(serve_request, on_tokens=events.on_tokens,
                               should_stop=lambda: events.stopped or server in _deleted_servers)
        if compiling:  # once the request is taken (a refused one ends with its error), before its tokens' events
            events.emit("status", message=COMPILING)
        events.relay(future)
        result = future.result()
        if result.first_token_seconds is not None:
            _answering_servers.add(server)
        if result.finish_reason == "cancelled" and not events.stopped and server in _deleted_servers:
            return _fail(events, request, MODEL_DELETED)
    except ContextLengthError as error:
        return _fail(events, request, str(error), code="context_length_exceeded")
    except (ValidationError, PromptError, ValueError, OSError) as error:
        return _fail(events, request, str(error))
    except Exception as error:  # reported to the user, and logged with its traceback for the operator
        logger.exception("generation %s failed", generation_id)
        return _fail(events, request, f"the model failed: {error}")
    done = done_fields(tokenizer, result, prompt)
    if parsed.message:
        chat_services.message_finish(message_id=parsed.message, text=result.text, finish_reason=result.finish_reason,
                                     completion_tokens=len(result.token_ids),
                                     first_token_seconds=result.first_token_seconds)
    events.emit("done", **done)
    return done


# A request without project_slug that no chat answer's row names the project of (an API completion): see
# _with_asking_project.
PROJECT_NOT_NAMED = ("this request was queued before an upgrade of Temper and names no project (project_slug), "
                     "which the serve worker now needs to check the model's folder before reading it; ask for the "
                     "answer again")


def _with_asking_project(request):
    """``request`` as sent, with the asking project's slug where it names none: the web sends it (``project_slug``)
    since the upgrade that made the serve worker judge the model's folder by it, and requests queued by a web from
    before it (answers waiting in the serve queue through the deploy) were refused with pydantic's "Field required"
    and the whole request, a message nobody could act on. A chat answer's project is its conversation's, as its
    row says (``chat.selectors.project_slug_of_answer``): what the web sends now, so the answer is written as the
    person asked it. Any other (an API completion, whose client asks again): a ``ValueError`` saying so
    (``PROJECT_NOT_NAMED``), which ends the generation with that error event."""
    if not isinstance(request, dict) or request.get("project_slug") is not None:
        return request
    message = request.get("message")
    slug = chat_selectors.project_slug_of_answer(message_id=message) if isinstance(message, str) else None
    if slug is None:
        raise ValueError(PROJECT_NOT_NAMED)
    return {**request, "project_slug": slug}


# A second delivery of a generation whose first worker died mid-answer ends it: generated again from the start, its
# tokens were numbered from 0 again, after the ones a page had shown already (which it skipped, gluing the rest on).
WORKER_LOST = ("the serve worker writing this answer stopped before it was done (killed, out of memory, or its host "
               "lost); regenerate it or send the message again")


def _fail(events: _Events | _ChoiceEvents, request, message: str, *, code: str | None = None) -> dict:
    chat_message = request.get("message") if isinstance(request, dict) else None
    if isinstance(chat_message, str):
        chat_services.message_finish(message_id=chat_message, error=message)
    events.emit("error", message=message, **({"code": code} if code else {}))
    return {"error": message}


@app.task(name="worker.tasks.serve.quantize_run", acks_late=True)
def quantize_run(run_dir: str) -> dict:
    """Write a succeeded run's serving copy ``export/quantized/`` (scheme ``TEMPER_SERVE_QUANTIZE``) with its
    memory, perplexity and greedy-agreement figures in ``quantization.json``; the chat serves it from then on. Its
    end is told to the project's export webhooks as a copy asked for by hand is (``automatic_copy_ended``).
    Acknowledged when done: a worker lost while writing leaves the message to another (the copy is written
    aside and renamed into place, so writing it again is safe)."""
    from jaxengine.data.formats import Entry
    from jaxengine.quantize import quantize_run_export
    from webapp.runs.serving_copies import SERVING_COPY_ERROR_FILE, automatic_copy_ended

    error_file = Path(run_dir) / SERVING_COPY_ERROR_FILE
    scheme = settings.TEMPER_SERVE_QUANTIZE
    try:
        description = quantize_run_export(run_dir, scheme_name=scheme, entry=Entry.LAUNCH)
    except Exception as error:  # the merged export still serves; the run page says why there is no copy
        logger.exception("serving copy of %s failed", run_dir)
        message = f"{type(error).__name__}: {error}"
        try:
            error_file.write_text(message)
        except OSError:
            logger.exception("the reason could not be written to %s", error_file)
        automatic_copy_ended(run_dir=run_dir, scheme=scheme, error=message)
        return {"error": message}
    finally:  # it loaded a model twice over and compiled its scoring
        drop_retired_programs_past_high_water()
    error_file.unlink(missing_ok=True)
    automatic_copy_ended(run_dir=run_dir, scheme=scheme)
    description.pop("modules", None)
    return description


@app.task(name="worker.tasks.serve.make_serving_copy", acks_late=True)
def make_serving_copy(copy_pk: int) -> dict:
    """Write a serving copy someone asked for (``webapp.runs.serving_copies.serving_copy_request``): of a
    run's final model made again or of an exported checkpoint, scored on its run's eval set, or of a base
    model, scored on the dataset version chosen, if any. Acknowledged late, so that its message stays in
    Redis while it writes (a copy whose message is gone is taken as lost and can be asked for again). The
    copy is renamed into place whole; a failure leaves the model serving as before and records the reason."""
    from webapp.runs import serving_copies

    copy = serving_copies.serving_copy_pending(copy_pk=copy_pk)
    if copy is None:
        return {"dropped": copy_pk}
    # Its directory may have gone since the copy was asked for: said in words, not as the engine's bare
    # "TokenizerError: …: no such directory".
    if missing := serving_copies.missing_source_files(copy):
        logger.warning("serving copy %s failed: %s", copy_pk, missing)
        serving_copies.serving_copy_finish(copy_pk=copy_pk, error=missing)
        return {"error": missing}
    try:
        from jaxengine.data.formats import Entry
        from jaxengine.quantize import quantize_model_dir, quantize_run_export

        source = serving_copies.source_dir(copy)
        if copy.run_id is not None:  # written inside export/ (the final model's) or the checkpoint's export
            description = quantize_run_export(copy.run.output_dir, scheme_name=copy.scheme, model_dir=source,
                                              eval_limit=serving_copies.EVAL_LIMIT, entry=Entry.LAUNCH)
        else:
            version = copy.eval_version
            description = quantize_model_dir(
                source, serving_copies.copy_dir(copy), scheme_name=copy.scheme,
                eval_path=version.absolute_path if version is not None else None,
                eval_data_kind=version.dataset.kind if version is not None else "sft",
                eval_columns=version.column_mapping if version is not None else None,
                eval_limit=serving_copies.EVAL_LIMIT, eval_source=serving_copies.MEASURED_ON)
    except Exception as error:  # the model serves unquantized (or its earlier copy); the page says why
        logger.exception("serving copy %s failed", copy_pk)
        return {"error": serving_copies.serving_copy_finish(copy_pk=copy_pk, error=error).error_message}
    finally:  # it loaded a model twice over and compiled its scoring
        drop_retired_programs_past_high_water()
    if copy.run_id is not None and copy.step is None:  # the automatic copy's failure is no longer the story
        (Path(copy.run.output_dir) / serving_copies.SERVING_COPY_ERROR_FILE).unlink(missing_ok=True)
    serving_copies.serving_copy_finish(copy_pk=copy_pk)
    description.pop("modules", None)
    return description
