"""OpenAI-compatible API: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``.

Authenticated by a project token (``Authorization: Bearer tpk_…``, ``webapp.chat.tokens``); model ids
are the project's chat models (``bm_…`` base models, ``run_…`` runs' exports, ``run_…:step-N``
checkpoints). A completion is one ``worker.tasks.serve.generate`` request; the view relays its
Redis events (``webapp.chat.events.relay``) as OpenAI chunks when ``stream`` is true (a chunk per ``token``
event: the text of a decode call's tokens, as OpenAI's chunks may carry several; the usage counts every
token), else waits for the ``done`` event. Errors have OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``. ``n`` answers (up to ``MAX_CHOICES``) are one task
whose answers decode as rows of one batch, each a generation of its own (``_choice_ids``) followed as a choice
as a list of prompts' are: chunks of each as they come, with its ``index``; the usage counts the prompt once.
A completion's ``echo`` puts the prompt before each answer: the worker's ``prompt`` event (the prompt's text and,
with ``logprobs``, its tokens' log probabilities) streams as the choice's first chunk, and a whole answer puts the
prompt and its tokens' entries (the done event's ``prompt_logprobs``) before the answer's.

A streamed completion answers once its first token (or its error) is there, so that a request the
model refuses (a prompt over its context) gets a 4xx status like a whole one, not a 200 stream with an
error in it. A client that goes away (Django cancels the view, or closes the stream, on the ASGI
disconnect) stops its generation, which would otherwise hold a place in the serve worker's batch.

An answer does not outlive its token's right to it: every ``sse.ACCESS_RECHECK_SECONDS``, as the browser's
streams, it asks again (``tokens.project_token_standing``), and once the token is revoked or expired, or its user
deactivated, removed from the project or made a viewer, it stops its generations (the stop flag the chat page's Stop
button sets) and ends with an error chunk, streamed, which the openai client raises as an ``APIError`` naming why,
or a 401, whole. It ran to its token limit.

A completion is recorded (``ApiGeneration``, ``services.api_generation_start``) under the lock of its model's row
before its request is queued, and the record deleted once it is answered: a deletion of the model, or of the
project, waits for that lock and is refused while the answer is written, as while a chat answer streams; one that
committed first makes the completion a 404 ("was deleted as the completion was being asked for").
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import pydantic
from asgiref.sync import sync_to_async
from django.conf import settings
import redis
from django.core.exceptions import RequestDataTooBig, ValidationError
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator
from pydantic_core import PydanticCustomError

from jaxengine.chat_template import TEMPLATE_VARIABLES_MAX
from jaxengine.prompts import vocabulary_problem
from webapp.api.problems import value_as_sent
from webapp.api.services import TOKEN_PREFIX as REST_TOKEN_PREFIX
from webapp.celery import app as celery_app
from webapp.chat import channels, selectors
from webapp.chat.events import MAX_STREAM_SECONDS, relay
from webapp.chat.openai_errors import body_problems, misspelt_field, said_again, with_misspellings
from webapp.chat.services import (FIRST_TOKEN_WAIT_SECONDS, GENERATE_TASK, MAX_CHOICES, api_generation_end,
                                  api_generation_start, generation_expiry_seconds)
from webapp.chat.tokens import project_token_authenticate, project_token_refusal, project_token_standing
from webapp.core import json_bodies, sse
from webapp.core.auth_header import bearer_secret
from webapp.core.numbers import MAX_STORED_INT, TOO_MANY_DIGITS
from webapp.core.streams import release_connections
from webapp.core.text import lone_surrogate_problem, shown_text
from webapp.runs.channels import redis_client

logger = logging.getLogger(__name__)

# Floats that take a JSON number (an integer too) but not a string or a boolean, as OpenAI's API, and not
# NaN (which Python's JSON reads): it was told it should be ≥ 0.
Number = Annotated[float, pydantic.Strict(), pydantic.AllowInfNan(False)] | StrictInt

FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "stop", "timeout": "length"}


def _without_nulls(data: Any) -> Any:
    """The body with its null fields left out: OpenAI's API takes null for any optional field (its schema
    marks them nullable) as the field not sent, and clients send it (a ``None`` left in a request's
    arguments). A required field sent as null is then missing, and named so."""
    return {key: value for key, value in data.items() if value is not None} if isinstance(data, dict) else data


class _RequestObject(BaseModel):
    """A JSON object of a request body. A field it does not read is ignored (clients send OpenAI's fields that
    Temper has no use for), except a near miss of one it reads (``openai_errors.misspelt_field``: ``temprature``,
    ``top-p``), which is refused naming the field meant: ignored, it left that field as if not sent. ``NOT_READ``:
    fields of OpenAI's API (and of other OpenAI-compatible servers) it does not read, never taken for a misspelling
    (``store`` is close to ``stop``)."""

    model_config = ConfigDict(extra="ignore")
    NOT_READ: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="wrap")
    @classmethod
    def _no_misspelt_fields(cls, data: Any, handler: pydantic.ValidatorFunctionWrapHandler) -> Any:
        # Wrapped, not before: its fields are validated all the same, and their problems said with the misspellings.
        # A key sent as null is one left out (``_without_nulls``), misspelt or not: it changes no answer.
        misspelt = {} if not isinstance(data, dict) else {
            key: meant for key, value in data.items()
            if isinstance(key, str) and value is not None and key not in cls.model_fields and key not in cls.NOT_READ
            and (meant := misspelt_field(key, read=cls.model_fields)) is not None}
        if not misspelt:
            return handler(data)
        try:
            handler(data)
        except pydantic.ValidationError as error:
            raise with_misspellings(model=cls.__name__, data=data, misspelt=misspelt, error=error) from None
        raise with_misspellings(model=cls.__name__, data=data, misspelt=misspelt, error=None)


class _StreamOptions(_RequestObject):
    NOT_READ = frozenset({"include_obfuscation"})
    include_usage: StrictBool = False  # a last chunk with no choices and the usage, as OpenAI sends it

    _nulls_left_out = model_validator(mode="before")(_without_nulls)


# Stop sequences one request may give, as OpenAI's API takes (the chat panel's conversation form too).
MAX_STOP_SEQUENCES = 4


# A value of logit_bias: its range said where it is of the wrong type (``logit_bias["5"]: "x" is not a number; give
# a number from -100 to 100``), and checked with its token id by ``_Body._token_ids_and_biases``.
LogitBias = Annotated[Number, Field(description="a number from -100 to 100")]


class _Body(_RequestObject):
    # OpenAI's request fields (chat and completions) that Temper does not read, and other OpenAI-compatible servers'
    # sampling fields near a field read here (vLLM's min_tokens, OpenRouter's top_a): accepted and ignored.
    NOT_READ = frozenset({
        "user", "store", "metadata", "service_tier", "modalities", "audio", "prediction", "reasoning_effort",
        "parallel_tool_calls", "web_search_options", "prompt_cache_key", "safety_identifier", "verbosity", "suffix",
        "best_of", "min_p", "min_tokens", "top_a", "repetition_penalty", "length_penalty"})
    model: pydantic.StrictStr = Field(description="the id of one of this project's models (GET /v1/models lists "
                                                  "them)")
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=8192)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, le=8192)
    temperature: Number = Field(default=1.0, ge=0.0, le=2.0)
    top_p: Number = Field(default=1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(default=0, ge=0, le=MAX_STORED_INT)  # not OpenAI's, as vLLM takes it; an int32
    seed: StrictInt | None = Field(default=None, ge=-2**63, lt=2**63)  # OpenAI's: a signed 64-bit integer
    stream: StrictBool = False
    stream_options: _StreamOptions | None = None
    n: StrictInt = Field(default=1, ge=1, le=MAX_CHOICES, description=(
        f"a whole number from 1 to {MAX_CHOICES} (the answers to sample, a choice each), or leave n out"))
    stop: str | list[str] | None = None
    response_format: dict[str, Any] | None = Field(default=None,
                                                   description='{"type": "text"}, or leave response_format out')
    presence_penalty: Number = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: Number = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, LogitBias] | None = Field(default=None, description=(
        'a JSON object of token ids (as strings of digits) to biases from -100 to 100, e.g. {"50256": -100}'))

    _nulls_left_out = model_validator(mode="before")(_without_nulls)

    @field_validator("logit_bias")
    @classmethod
    def _token_ids_and_biases(cls, logit_bias: dict[str, float] | None) -> dict[int, float] | None:
        # The ids are checked against the model's vocabulary where it is loaded (the serve worker's 400).
        if logit_bias is None:
            return None
        if len(logit_bias) > MAX_LOGIT_BIAS_TOKENS:
            raise ValueError(f"{len(logit_bias)} tokens; give at most {MAX_LOGIT_BIAS_TOKENS}")
        biases = {}
        for key, bias in logit_bias.items():
            if not (key.isascii() and key.isdecimal() and int(key) <= MAX_STORED_INT):
                raise ValueError(f"{shown_text(key)} is not a token id: give token ids of the model's tokenizer as strings "
                                 'of digits, e.g. {"50256": -100}')
            if not -100 <= bias <= 100:
                raise ValueError(f"the bias of token {key} is {bias}; give a number from -100 to 100")
            biases[int(key)] = float(bias)
        return biases

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, response_format: dict[str, Any] | None) -> dict[str, Any] | None:
        # Refused, not ignored: a client asking for JSON parses the answer as JSON, and these models' answers
        # are free text (nothing constrains their tokens to a grammar).
        kind = None if response_format is None else response_format.get("type")
        if response_format is None or kind == "text":
            return response_format
        if kind in ("json_object", "json_schema"):
            raise _unsupported("response_format", f"{kind} output: the answers here are free text, not constrained "
                               "to JSON", '{"type": "text"}')
        raise ValueError(f"type {kind!r} is not one of 'text', 'json_object', 'json_schema'")

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, options, info: pydantic.ValidationInfo):
        # As OpenAI's and vLLM's servers answer: it sets what a stream carries, and there is no stream. (A stream
        # refused, "stream": "yes", is not in info.data: its own problem is the one to mend.)
        if options is not None and "stream" in info.data and info.data["stream"] is not True:
            raise ValueError("only allowed when stream is true; leave it out, or set stream: true")
        return options

    @property
    def stop_strings(self) -> list[str]:
        """OpenAI's ``stop``: one string or up to four."""
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @field_validator("stop", mode="before")
    @classmethod
    def _up_to_four_non_empty(cls, stop):
        if stop is None or stop == []:  # no stop sequence, as OpenAI's and vLLM's servers read an empty list
            return None
        given = [stop] if isinstance(stop, str) else stop
        if not isinstance(given, list) or not all(isinstance(text, str) for text in given):
            raise ValueError("give a string or a list of strings")
        if len(given) > MAX_STOP_SEQUENCES:
            raise ValueError(f"give at most {MAX_STOP_SEQUENCES} stop sequences")
        if any(not text for text in given):
            raise ValueError("a stop sequence must not be empty")
        _refuse_lone_surrogates(*given)
        return stop

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_budget(cls, budget: int | None, info: pydantic.ValidationInfo) -> int | None:
        # OpenAI reads max_tokens as max_completion_tokens' older name: two numbers are two budgets for one answer.
        older = info.data.get("max_tokens")
        if budget is not None and older is not None and budget != older:
            raise ValueError(f"{budget} is not max_tokens ({older}): max_tokens is the older name of "
                             "max_completion_tokens; send one of them")
        return budget

    @property
    def budget(self) -> int | None:
        """The new tokens asked for; None when neither field says: the serve worker then gives what the
        model's context leaves after the prompt, up to 256 (``worker.tasks.serve.fit_to_context``)."""
        return self.max_completion_tokens or self.max_tokens


class _Message(_RequestObject):
    NOT_READ = frozenset({"name", "tool_calls", "tool_call_id", "refusal", "audio", "function_call"})
    role: Literal["system", "developer", "user", "assistant"]
    content: pydantic.StrictStr = Field(description="the message's text: a string, or a JSON array of text parts "
                                                    '{"type": "text", "text": ...}')

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, content):
        """Content as OpenAI's clients may send it, a list of parts ``{"type": "text", "text": ...}``,
        becomes one string, the parts joined by a line break (as vLLM's server joins them)."""
        if not isinstance(content, list):
            return content
        texts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict):
                raise ValueError(f"part {index} is not an object: send text parts "
                                 '({"type": "text", "text": ...}) or a string')
            kind = part.get("type")
            if kind != "text":
                raise ValueError(f"part {index} is of type {kind!r}: these models read text only; send text parts "
                                 '({"type": "text", "text": ...}) or a string')
            if not isinstance(part.get("text"), str):
                raise ValueError(f"part {index}: a text part needs its text as a string")
            texts.append(part["text"])
        return "\n".join(texts)

    @field_validator("content")
    @classmethod
    def _whole_characters(cls, content: str) -> str:
        return _refuse_lone_surrogates(content)


# Alternatives per token that a request may ask log probabilities of, as OpenAI's API: chat's top_logprobs (the
# engine's jaxengine.serving.LOGPROBS_MAX) and /v1/completions' logprobs.
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5


def _unsupported(field: str, why: str, off: str) -> PydanticCustomError:
    """A field asking for what these answers cannot hold: refused (code ``unsupported_value``), not ignored, since
    a client that asked for it reads it from the answer (``choices[0].message.tool_calls``)."""
    return PydanticCustomError("unsupported_value", f"not supported: {why}; leave {field} out (or send {off})")


NO_TOOLS = "the answers here are text only, the model is not asked to call tools"


_CHOICE_OF = {"tools": "tool_choice", "functions": "function_call"}  # each list and the field that asks for no call


# A value of chat_template_kwargs: a JSON scalar (a list or an object is no template variable Temper passes).
TemplateValue = Annotated[pydantic.StrictStr | Number | StrictBool | None,
                          Field(description="a JSON scalar: a string, a number, true/false or null")]


class ChatBody(_Body):
    messages: list[_Message] = Field(min_length=1, description='a JSON array of messages, each {"role": ..., '
                                                               '"content": ...}, at least one')
    # vLLM's and SGLang's field: variables for the model's chat template ({"enable_thinking": false} for Qwen3), over
    # the model's own (a Temper run's export keeps its data.chat_template_kwargs).
    chat_template_kwargs: dict[str, TemplateValue] | None = Field(
        default=None, max_length=TEMPLATE_VARIABLES_MAX,
        description='a JSON object of chat template variables, e.g. {"enable_thinking": false}')
    # Each answer token's log probability (``choices[0].logprobs.content``) and its top_logprobs most likely
    # alternatives': the model's own distribution, before temperature, top-k/top-p, penalties and logit_bias.
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    # Before tools, so that tools' check reads it: tools with tool_choice "none" ask for no call.
    tool_choice: str | dict[str, Any] | None = Field(default=None, description=f'"none" ({NO_TOOLS}), or leave '
                                                                               "tool_choice out")
    tools: list[Any] | None = None
    # Their legacy names, which OpenAI's API still takes: refused alike, not ignored.
    function_call: str | dict[str, Any] | None = Field(default=None, description=f'"none" ({NO_TOOLS}), or leave '
                                                                                 "function_call out")
    functions: list[Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _settable_template_variables(cls, variables: dict[str, Any] | None) -> dict[str, Any] | None:
        from jaxengine.chat_template import template_variable_problem

        for name, value in (variables or {}).items():
            if problem := template_variable_problem(name, value):
                # The problem names the name in full (repr): a 5,000-character name is shown cut short.
                problem = problem.removeprefix(repr(name)).removeprefix(": ")
                raise ValueError(f"{shown_text(name)}{'' if problem.startswith(' ') else ': '}{problem}")
        return variables

    @field_validator("tool_choice", "function_call")
    @classmethod
    def _no_call_asked(cls, choice, info: pydantic.ValidationInfo):
        if choice is not None and choice != "none":
            raise _unsupported(info.field_name, NO_TOOLS, '"none"')
        return choice

    @field_validator("tools", "functions")
    @classmethod
    def _no_tools(cls, tools, info: pydantic.ValidationInfo):
        choice = _CHOICE_OF[info.field_name]
        if tools and choice in info.data and info.data[choice] != "none":  # (a choice refused is said on its own)
            raise _unsupported(info.field_name, NO_TOOLS, f'{choice}: "none"')
        return tools

    @field_validator("top_logprobs")
    @classmethod
    def _with_logprobs(cls, top_logprobs: int | None, info: pydantic.ValidationInfo) -> int | None:
        # As OpenAI's API: alternatives come with the tokens' own log probabilities, which logprobs asks for.
        if top_logprobs and info.data.get("logprobs") is False:
            raise ValueError(f"{top_logprobs} alternatives asked for without the tokens' log probabilities; send "
                             "logprobs: true with it, or leave top_logprobs out")
        return top_logprobs

    @property
    def alternatives(self) -> int | None:
        """The alternatives per token to return log probabilities of (None: no log probabilities)."""
        return (self.top_logprobs or 0) if self.logprobs else None


# Tokens one logit_bias may name (jaxengine.sampler.LOGIT_BIAS_MAX_TOKENS: a row's bias is an array that long).
MAX_LOGIT_BIAS_TOKENS = 1024

# Prompts one /v1/completions request may list: each is a generation of its own in the serve worker's batch.
MAX_PROMPTS = 32


# max_tokens 0 without echo: nothing to answer. OpenAI's API takes 0 to echo the prompt alone (scoring it); vLLM's
# server follows it there and refuses 0 otherwise ("max_tokens must be at least 1"), as Temper did before echo.
NOTHING_TO_GENERATE = ("0 generates nothing: it is taken only with echo: true (the prompt alone, scored with "
                       "logprobs); give a whole number from 1 to 8192, or send echo: true")


# The forms of /v1/completions' prompt, as OpenAI's and vLLM's servers take them.
PROMPT_FORMS = ("a string, a list of strings, a list of token ids (one prompt) or a list of lists of token ids (a "
                "prompt each)")
# What a token id sent in a prompt may be here, before the model is looked at: one past its vocabulary is refused
# naming its range (CompletionBody.past_vocabulary, where config.json states it; else the serve worker's
# jaxengine.serving.BatchDecoder.check_prompt, in the same words).
TOKEN_IDS = "token ids are whole numbers from 0 to the model's vocabulary size less one"


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_ids_problem(ids: list, *, prompt: int | None = None) -> str | None:
    """What makes ``ids`` (a prompt sent as token ids, ``prompt`` its place in a list of them) no prompt, or None."""
    which = "" if prompt is None else f" of prompt {prompt}"
    if not ids:
        return f"prompt {prompt} is an empty list of token ids; give at least one token id"
    for index, token_id in enumerate(ids):
        if not _is_token_id(token_id):
            return f"the item at index {index}{which}, {value_as_sent(token_id)}, is not a token id; {TOKEN_IDS}"
        if not 0 <= token_id <= MAX_STORED_INT:
            return f"the token id at index {index}{which}, {token_id}, is out of range; {TOKEN_IDS}"
    return None


def _item_kind(item: Any) -> str | None:
    """The kind of an item of a ``prompt`` list, in the plural: ``strings``, ``token ids``, ``lists`` (of token ids,
    checked apart), or None (no item of a prompt)."""
    if isinstance(item, str):
        return "strings"
    if isinstance(item, list):
        return "lists"
    return "token ids" if _is_token_id(item) else None


def _prompts_of(prompt: str | list) -> list:
    """The prompts of a ``prompt`` field: a string, or a list of token ids, is one."""
    return [prompt] if isinstance(prompt, str) or (prompt and _is_token_id(prompt[0])) else prompt


class CompletionBody(_Body):
    # From 0 here: max_tokens 0 with echo (the prompt's log probabilities alone) is how text is scored.
    max_tokens: StrictInt | None = Field(default=None, ge=0, le=8192)
    # Token ids are a prompt's tokens exactly (no BOS added, never turned into text and tokenized again), as
    # lm-evaluation-harness's local-completions sends its prompts by default.
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]] = Field(description=(
        f"{PROMPT_FORMS}; up to {MAX_PROMPTS} prompts, a choice each"))
    # The sampled token's log probability and those of this many most likely alternatives (OpenAI's legacy
    # ``choices[0].logprobs``: tokens, token_logprobs, top_logprobs, text_offset), before sampling settings.
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    # The prompt before the completion in each choice's text (streamed first), and with logprobs its tokens' entries
    # before the completion's, the first token's log probability null (nothing before it predicts it), as OpenAI's
    # and vLLM's: how lm-evaluation-harness's local-completions scores text.
    echo: StrictBool = False

    @model_validator(mode="wrap")
    @classmethod
    def _something_to_answer(cls, data: Any, handler: pydantic.ValidatorFunctionWrapHandler) -> Any:
        # Read from the body as sent (echo is a strict boolean: only true is true), and said with its other problems,
        # naming max_tokens: a field validator of max_tokens runs before echo is read.
        nothing = (isinstance(data, dict) and type(data.get("max_tokens")) is int and data["max_tokens"] == 0
                   and data.get("echo") is not True)
        if not nothing:
            return handler(data)
        problem = {"type": PydanticCustomError("value_error", NOTHING_TO_GENERATE), "loc": ("max_tokens",),
                   "input": 0}
        others = []
        try:
            handler(data)
        except pydantic.ValidationError as error:
            others = [said_again(other) for other in error.errors(include_url=False)]
        raise pydantic.ValidationError.from_exception_data(cls.__name__, [problem, *others])

    @property
    def alternatives(self) -> int | None:
        return self.logprobs

    @field_validator("prompt", mode="before")
    @classmethod
    def _texts_or_token_ids(cls, prompt):
        # One of OpenAI's four forms (PROMPT_FORMS), never a mix (strings and lists of ids), as OpenAI's API refuses
        # one.
        if isinstance(prompt, str):
            return _refuse_lone_surrogates(prompt)
        if not isinstance(prompt, list):
            raise ValueError(f"give {PROMPT_FORMS}")
        if not prompt:
            raise ValueError("give at least one prompt (an empty list is none)")
        kinds = [_item_kind(item) for item in prompt]
        if None in kinds:
            index = kinds.index(None)
            raise ValueError(f"the item at index {index}, {value_as_sent(prompt[index])}, is not a string, a token id "
                             f"or a list of token ids; give {PROMPT_FORMS}")
        if len(set(kinds)) > 1:
            raise ValueError(f"the list mixes {' and '.join(sorted(set(kinds)))}; give {PROMPT_FORMS}, not a mix")
        if kinds[0] == "token ids":  # one prompt's
            if problem := _token_ids_problem(prompt):
                raise ValueError(problem)
            return prompt
        if len(prompt) > MAX_PROMPTS:
            raise ValueError(f"give at most {MAX_PROMPTS} prompts")
        if kinds[0] == "strings":
            _refuse_lone_surrogates(*prompt)
            return prompt
        for index, ids in enumerate(prompt):
            if problem := _token_ids_problem(ids, prompt=index):
                raise ValueError(problem)
        return prompt

    @field_validator("prompt")
    @classmethod
    def _choices_bounded(cls, prompt: str | list, info: pydantic.ValidationInfo) -> str | list:
        # Every prompt's n answers are a generation each that the view follows: as many as a list of prompts may ask.
        n, count = info.data.get("n", 1), len(_prompts_of(prompt))
        if count * n > MAX_PROMPTS:
            raise ValueError(f"{count} prompts with n {n} ask for {count * n} choices; ask for at most "
                             f"{MAX_PROMPTS} (fewer prompts, or a smaller n)")
        return prompt

    @property
    def prompts(self) -> list[str | list[int]]:
        """Each prompt: its text, or its token ids."""
        return _prompts_of(self.prompt)

    def past_vocabulary(self, vocab_size: int) -> str | None:
        """That a prompt sent as token ids has one outside a vocabulary of ``vocab_size`` ids (the serve worker's
        words, ``jaxengine.prompts.vocabulary_problem``: its index, of which prompt of a list, and the range), or
        None."""
        several = not _is_token_id(self.prompt[0])  # a list of lists of ids names its prompt, as _token_ids_problem
        for index, prompt in enumerate(self.prompts):
            if isinstance(prompt, list) and (problem := vocabulary_problem(prompt, vocab_size=vocab_size,
                                                                           prompt=index if several else None)):
                return problem
        return None


def _refuse_lone_surrogates(*texts: str) -> str:
    """The (last) text, once none holds half of a UTF-16 pair ("\\ud800" in JSON): the serve worker's
    tokenizer failed on one, answering with its C++ binding's words."""
    for text in texts:
        if problem := lone_surrogate_problem(text):
            raise ValueError(problem)
    return texts[-1]


def _error(status: int, message: str, *, kind: str = "invalid_request_error", code: str | None = None,
           param: str | None = None) -> JsonResponse:
    return JsonResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status=status)


def _method_not_allowed(request: HttpRequest, method: str) -> JsonResponse:
    """405 in OpenAI's error shape, with the ``Allow`` header RFC 9110 requires on a 405 (each address takes
    one method)."""
    response = _error(405, f"{request.method} is not allowed here; use {method}", code="method_not_allowed")
    response["Allow"] = method
    return response


def _invalid_body(error: pydantic.ValidationError, schema: type[_Body]) -> JsonResponse:
    """The body's problems, said by ``openai_errors.body_problems``, a line each: its field as the client wrote it
    (``messages[2].content``), what was wrong and what to give instead. OpenAI's error names one ``param`` and one
    ``code``: the first problem's."""
    problems = body_problems(error, schema=schema)
    return _error(400, "\n".join(problem.message for problem in problems), code=problems[0].code,
                  param=problems[0].param)


def _authenticate(request: HttpRequest):
    return project_token_authenticate(request.headers.get("Authorization", ""))


def _why_no_token(header: str) -> str:
    """Why ``Authorization: header`` names no project token, in words: a token sent (revoked, mistyped, the REST API's)
    is not told to send one."""
    secret = bearer_secret(header)
    if secret is None:
        return ("send 'Authorization: Bearer <token>' with a project token (tpk_…): made on the project's Chat page "
                "under 'API tokens for this project', or by python manage.py apitoken; tokens of the API tokens page "
                "(tmp_…) are for the REST API at /api/v1/")
    if secret.startswith(REST_TOKEN_PREFIX):
        return ("this is a REST API token (tmp_…), for the REST API at /api/v1/; /v1/ takes a project token (tpk_…), "
                "made on the project's Chat page under 'API tokens for this project', or with this token: POST "
                "/api/v1/projects/<slug>/chat-tokens/ (GET /api/v1/projects/ lists the slugs)")
    return ("the token sent is not a valid project token (revoked, or mistyped); make a new one on the project's Chat "
            "page under 'API tokens for this project' (or with a REST API token: POST /api/v1/projects/<slug>/"
            "chat-tokens/) and send it as 'Authorization: Bearer <token>'")


def _unauthorized(request: HttpRequest) -> JsonResponse:
    refusal = project_token_refusal(request.headers.get("Authorization", ""))
    if refusal is not None and not refusal[1]:  # a real token whose user's role changed: not "send a token"
        return _error(403, refusal[0], kind="permission_error", code="insufficient_role")
    if refusal is not None:  # expired: no longer a key, as a revoked one, but saying why
        response = _error(401, refusal[0], kind="authentication_error", code="invalid_api_key")
        response["WWW-Authenticate"] = 'Bearer realm="temper"'
        return response
    response = _error(401, _why_no_token(request.headers.get("Authorization", "")), kind="authentication_error",
                      code="invalid_api_key")
    response["WWW-Authenticate"] = 'Bearer realm="temper"'  # RFC 9110 requires it on a 401
    return response


@csrf_exempt
def models(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return _method_not_allowed(request, "GET")
    token = _authenticate(request)
    if token is None:
        return _unauthorized(request)
    # A model whose folder is gone is left out: a request naming it is answered as one naming no model
    # (_model_not_found).
    data = [_model_json(choice, token) for choice in selectors.model_choices(project=token.project) if not choice.gone]
    return JsonResponse({"object": "list", "data": data})


def _model_json(choice, token) -> dict[str, Any]:
    # ``quantization``: the serving copy that answers (int8, int4), null while the model serves unquantized.
    return {"id": choice.ref, "object": "model", "created": choice.created, "owned_by": token.project.slug,
            "name": choice.label, "quantization": choice.quantization or None}


@csrf_exempt
def model(request: HttpRequest, model_id: str) -> HttpResponse:
    """``GET /v1/models/{id}`` (the openai client's ``models.retrieve``)."""
    if request.method != "GET":
        return _method_not_allowed(request, "GET")
    token = _authenticate(request)
    if token is None:
        return _unauthorized(request)
    choice = selectors.model_choice(project=token.project, ref=model_id)
    if choice is None or choice.gone:
        why = None if choice is not None else selectors.run_serves_no_model(project=token.project, ref=model_id)
        return _model_not_found(model_id, token, choice, why=why)
    return JsonResponse(_model_json(choice, token))


def _model_not_found(model_id: str, token, choice=None, *, why: str | None = None) -> JsonResponse:
    """The 404 of a ``model`` the project has not (``choice`` None; ``why``: ``selectors.run_serves_no_model``'s
    words for a run of the project that serves no model), or whose folder is gone (``ModelChoice.gone``, said in its
    refusal's words): ``GET /v1/models`` lists neither."""
    if choice is not None:
        return _error(404, f"{choice.refused} (GET /v1/models lists the models there are)", code="model_not_found",
                      param="model")
    return _error(404, why or f"the model {shown_text(model_id)} does not exist in project {token.project.slug}; "
                              "GET /v1/models lists them", code="model_not_found", param="model")


def engine_seed(seed: int) -> int:
    """The engine's 32-bit seed for an API ``seed`` of 64 bits: a seed in [0, 2**32) as it is, any other folded
    by a hash, so the same seed always draws the same and 2**32 does not draw as 0 (as wrapping would)."""
    if 0 <= seed < 2**32:
        return seed
    digest = hashlib.blake2b(seed.to_bytes(8, "big", signed=True), digest_size=4).digest()
    return int.from_bytes(digest, "big")


def _choices_field(body: _Body) -> dict[str, int]:
    """A request's ``n`` for its serve task: its answers decode as rows of one batch (``worker.tasks.serve``'s
    ``_ChoiceEvents``), each a generation of its own; left out for one answer."""
    return {"n": body.n} if body.n > 1 else {}


def _choice_ids(task_ids: list[str], n: int) -> list[str]:
    """The generation of each choice, its place its ``index``: each task's (a prompt's) ``n`` answers in turn, as
    OpenAI numbers a list of prompts' choices (prompt p's answer i is choice p * n + i)."""
    return task_ids if n == 1 else [channels.choice_id(task_id, index) for task_id in task_ids for index in range(n)]


def _request(body: _Body, choice, generation_id: str, *, project_slug: str, messages=None, prompt=None,
             prompt_token_ids=None) -> dict[str, Any]:
    request = {"id": generation_id, "model_key": choice.cache_key, "model_path": choice.path,
               "project_slug": project_slug,
               "max_new_tokens": body.budget, "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
               "seed": engine_seed(body.seed) if body.seed is not None else secrets.randbelow(2**31),
               "stop": body.stop_strings, "presence_penalty": body.presence_penalty,
               "frequency_penalty": body.frequency_penalty, "logit_bias": body.logit_bias or {}}
    if body.alternatives is not None:
        request["logprobs"] = body.alternatives
    if getattr(body, "echo", False):
        request["echo"] = True
    if messages is not None:
        request["messages"] = [{"role": "system" if m.role == "developer" else m.role, "content": m.content}
                               for m in messages]
        # A run's model's variables as its Run row has them (ModelChoice.template_kwargs), then the request's.
        if variables := {**choice.template_kwargs, **(body.chat_template_kwargs or {})}:
            request["chat_template_kwargs"] = variables
    elif prompt_token_ids is not None:
        request["prompt_token_ids"] = prompt_token_ids
    else:
        request["prompt"] = prompt
    return request


async def _start(request: HttpRequest, schema: type[_Body], prefix: str):
    """(token, parsed body, model choice, generation id) or an error response."""
    if request.method != "POST":
        return _method_not_allowed(request, "POST")
    token = await sync_to_async(_authenticate)(request)
    if token is None:
        return await sync_to_async(_unauthorized)(request)
    try:
        data = json_bodies.loads(request.body or b"{}")
    except RequestDataTooBig:
        return _error(413, f"the body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes; send a shorter prompt",
                      code="request_too_large")
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        return _error(400, f"the body is not JSON: {error}")
    except json_bodies.DuplicateKey as error:  # before ValueError, which it is
        return _error(400, str(error), code="duplicate_key")
    except RecursionError:
        return _error(400, "the body nests too deeply to be a request")
    except ValueError:  # not a JSONDecodeError: a number past Python's digit limit
        return _error(400, f"the body cannot be read: {TOO_MANY_DIGITS}")
    if not isinstance(data, dict):
        return _error(400, "the body must be a JSON object")
    try:
        body = schema.model_validate(data)
    except pydantic.ValidationError as error:
        return _invalid_body(error, schema)
    choice = await sync_to_async(selectors.model_choice)(project=token.project, ref=body.model)
    if choice is None or choice.gone:
        why = (None if choice is not None
               else await sync_to_async(selectors.run_serves_no_model)(project=token.project, ref=body.model))
        return _model_not_found(body.model, token, choice, why=why)
    if choice.refused:  # registered before its directory lay in another project's folder: never sent to a worker
        return _error(409, choice.refused, code="model_not_loadable", param="model")
    if isinstance(body, CompletionBody) and not isinstance(body.prompt, str):  # token ids, maybe: their range
        vocab_size = await sync_to_async(selectors.vocabulary_size)(choice)
        if vocab_size is not None and (problem := body.past_vocabulary(vocab_size)):
            return _error(400, problem, code="invalid_value", param="prompt")
    return token, body, choice, f"{prefix}-{secrets.token_hex(12)}"


def answer_wait_seconds() -> float:
    """How long a completion waits for its generation's last event: until the latest a generation can end (taken
    up by a worker just before it expires, then its wait for compiles and its whole timeout), and never less than a
    chat page's stream."""
    return max(MAX_STREAM_SECONDS,
               generation_expiry_seconds() + FIRST_TOKEN_WAIT_SECONDS + settings.TEMPER_SERVE_TIMEOUT_SECONDS)


async def _events(generation_id: str) -> AsyncIterator[dict[str, Any]]:
    """The generation's events (see ``webapp.chat.channels``), ending with ``unavailable`` when Redis went away, or
    ``unanswered`` when no last event came in ``answer_wait_seconds`` (no serve worker took the request up)."""
    redis_lost = False
    async for line in relay(generation_id, max_seconds=answer_wait_seconds()):
        if line.startswith("data: "):
            event = json.loads(line[len("data: "):])
            if event["type"] == "unavailable":
                redis_lost = True
                continue
            yield event
            if event["type"] in channels.TERMINAL_TYPES:
                return
    yield {"type": "unavailable" if redis_lost else "unanswered"}


# The events whose text (and log probabilities) a stream sends on: an echo's ``prompt``, before the answer's ``token``s.
OUTPUT_TYPES = ("prompt", "token")


async def _first_output(events: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    """The first event that is not a ``status`` (model loading) or an empty output (no text, no log
    probabilities)."""
    async for event in events:
        if event["type"] == "status" or (event["type"] in OUTPUT_TYPES and not _carries_output(event)):
            continue
        return event
    return {"type": "unavailable"}


def _carries_output(event: dict[str, Any]) -> bool:
    """Whether a ``token`` or ``prompt`` event has something for the client: text, or its tokens' log probabilities
    (a token whose text is held back, part of a character or of a possible stop string, has them)."""
    return bool(event["text"] or event.get("logprobs"))


def _stop(generation_id: str) -> None:
    """Ask the serve worker to end a generation whose client went away."""
    try:
        channels.request_stop(redis_client(), generation_id)
    except redis.RedisError as error:
        logger.warning("generation %s: its client went away; the stop was not sent: %s", generation_id, error)


async def _final(generation_id: str) -> dict[str, Any]:
    """The generation's last event (``done`` or ``error``), or why none came (``unavailable``, ``unanswered``)."""
    last: dict[str, Any] = {"type": "unavailable"}
    try:
        async for event in _events(generation_id):
            last = event
    except asyncio.CancelledError:  # the client went away
        _stop(generation_id)
        raise
    return last


def _token_standing(*, token_id: int) -> str | None:
    try:
        return project_token_standing(token_id=token_id)
    finally:  # a stream's connection goes back to the pool between checks (webapp.core.streams)
        release_connections()


async def _token_watch(token_id: int) -> AsyncIterator[dict[str, Any]]:
    """Nothing while the token ``token_id`` may be used; a ``revoked`` event, saying why, once it may not."""
    while True:
        await asyncio.sleep(sse.ACCESS_RECHECK_SECONDS)
        try:
            refusal = await sync_to_async(_token_standing)(token_id=token_id)
        except DatabaseError as error:  # asked again next time: a database hiccup does not end the answer
            logger.warning("token %s: its standing could not be read: %s", token_id, error)
            continue
        if refusal is not None:
            yield {"type": "revoked", "message": refusal}
            return


def _usage(dones: list[dict[str, Any]]) -> dict[str, int]:
    """The usage of every choice's generation (its ``done`` event) together: a prompt's tokens once however many
    answers it has (only its first answer's, ``choice`` 0, are counted), as OpenAI counts them."""
    prompt = sum(done.get("prompt_tokens", 0) for done in dones if not done.get("choice"))
    completion = sum(done.get("completion_tokens", 0) for done in dones)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


REDIS_LOST = "the live event channel (Redis) is unavailable; try again"


def _unanswered() -> str:
    return (f"no serve worker answered within {answer_wait_seconds():.0f} s: check that a serve worker consumes the "
            "'serve' queue (scripts/up.sh starts one) and is not stuck, then try again")


def _prompt_of_choice(index: int, *, n: int, prompts: int) -> int | None:
    """The place of choice ``index``'s prompt in a list of ``prompts`` with ``n`` answers each (``_choice_ids``), or
    None where there is one prompt."""
    return index // n if prompts > 1 else None


def _failed(event: dict[str, Any], *, prompt: int | None = None) -> JsonResponse:
    """The error of a generation that failed; ``prompt``: its prompt's place in a list of several, which the worker's
    message (of its one prompt) cannot name."""
    if event["type"] == "error":  # the worker's code: context_length_exceeded, or none for other refusals
        where = "" if prompt is None else f" (prompt {prompt} of the list, counted from 0)"
        return _error(400, event["message"] + where, code=event.get("code") or "generation_failed")
    if event["type"] == "unanswered":
        return _error(503, _unanswered(), kind="server_error", code="no_serve_worker")
    return _error(503, REDIS_LOST, kind="server_error")


def _revoked_error(event: dict[str, Any]) -> dict[str, Any]:
    return {"message": f"this completion was stopped: {event['message']}", "type": "invalid_request_error",
            "param": None, "code": "invalid_api_key"}


def _revoked(event: dict[str, Any]) -> JsonResponse:
    """A whole answer whose token may no longer be used (``_token_watch``): a 401, as a new request with it gets."""
    return JsonResponse({"error": _revoked_error(event)}, status=401)


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


async def _from(first: dict[str, Any], events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    yield first
    async for event in events:
        yield event


async def _merged(streams: list[AsyncIterator[dict[str, Any]]]) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """``(index, event)`` of several generations' events, each as it comes (one task per stream, cancelled
    when the merge is closed); an error reading one is raised here."""
    queue: asyncio.Queue[tuple[int, dict[str, Any] | Exception | None]] = asyncio.Queue()

    async def pump(index: int, events: AsyncIterator[dict[str, Any]]) -> None:
        try:
            async for event in events:
                queue.put_nowait((index, event))
        except Exception as error:  # noqa: BLE001 - handed to the reader, which raises it
            queue.put_nowait((index, error))
        else:
            queue.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(index, events)) for index, events in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            index, event = await queue.get()
            if isinstance(event, Exception):
                raise event
            if event is None:
                left -= 1
            else:
                yield index, event
    finally:
        for task in tasks:
            task.cancel()


async def _stream(generations: list[tuple[str, dict[str, Any], AsyncIterator[dict[str, Any]]]], chunk,
                  *, include_usage: bool, answer_id: str | None = None,
                  token_id: int | None = None) -> AsyncIterator[str]:
    """The chunks of the ``(generation id, first output event, the events after it)`` of each choice, its index
    its place in ``generations``, as their events come; a stream closed before they ended (the client went away,
    one of them failed, or the token ``token_id`` may no longer be used: ``_token_watch``) stops those still
    going. Once it ends, however it ends, the completion ``answer_id`` is no longer being answered
    (``api_generation_end``)."""
    going = set(range(len(generations)))
    dones: list[dict[str, Any]] = []
    streams = [_from(first, events) for _generation_id, first, events in generations]
    merged = _merged(streams + ([_token_watch(token_id)] if token_id is not None else []))
    try:
        async for index, event in merged:
            if event["type"] == "revoked":
                yield _sse({"error": _revoked_error(event)})
                break
            if event["type"] in OUTPUT_TYPES and _carries_output(event):
                yield _sse(chunk(index, event["text"], None, event.get("logprobs")))
            elif event["type"] == "done":
                going.discard(index)
                dones.append(event)
                yield _sse(chunk(index, "", FINISH_REASONS[event["finish_reason"]]))
                if include_usage and not going:
                    yield _sse(chunk(index, None, None) | {"choices": [], "usage": _usage(dones)})
            elif event["type"] in ("error", "unavailable", "unanswered"):
                going.discard(index)
                message = event.get("message") or (_unanswered() if event["type"] == "unanswered" else REDIS_LOST)
                yield _sse({"error": {"message": message, "type": "server_error", "param": None, "code": None}})
                break
            if not going:  # the token's watch goes on until closed
                break
        yield "data: [DONE]\n\n"
    finally:
        await merged.aclose()
        for index in going:
            _stop(generations[index][0])
        if answer_id is not None:
            await sync_to_async(api_generation_end)(generation_id=answer_id)


class _AnswerStream:
    """``_stream``'s chunks as Django is handed them. A client that goes away once the view has answered but before
    Django reads the stream (as the response's head is sent) leaves the stream never started, so its ``finally``,
    which stops the generations and ends the completion's record, never runs; Django then only closes the response,
    which calls ``close`` here (a streamed content's ``close`` is one of the response's closers), and that does it."""

    def __init__(self, generations: list[tuple[str, dict[str, Any], AsyncIterator[dict[str, Any]]]], chunk, *,
                 include_usage: bool, answer_id: str, token_id: int):
        self._generations, self._answer_id = generations, answer_id
        self._chunks = _stream(generations, chunk, include_usage=include_usage, answer_id=answer_id,
                               token_id=token_id)
        self._started = False

    def __aiter__(self) -> _AnswerStream:
        return self

    async def __anext__(self) -> str:
        # Set before the stream's first step, which enters its try at once: from here its finally does the ending.
        self._started = True
        return await anext(self._chunks)

    def close(self) -> None:
        if self._started:
            return
        for generation_id, first, _events in self._generations:
            if first["type"] not in channels.TERMINAL_TYPES:
                _stop(generation_id)
        api_generation_end(generation_id=self._answer_id)


def _streaming(events: _AnswerStream) -> StreamingHttpResponse:
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


@dataclass(frozen=True)
class _Endpoint:
    """What a chat completion and a text completion differ in: the body, the ids and object names, and
    where the text sits in a choice (``delta``/``message`` or ``text``)."""

    schema: type[_Body]
    id_prefix: str
    chunk_object: str
    final_object: str
    inputs: Callable[[Any], list[dict[str, Any]]]  # each task's messages or prompt (n answers each)
    chunk_text: Callable[[str, bool], dict[str, Any]]  # (text, whether it is the choice's first text of the stream)
    final_text: Callable[[str], dict[str, Any]]
    # Whether each choice's text begins with its prompt's: the serve worker's (streamed: its ``prompt`` event; whole:
    # its ``done``'s ``prompt_text``), a prompt of token ids having no text of its own until decoded.
    echoes: Callable[[Any], bool]
    # A choice's ``logprobs``: (the events' entries, ``worker.tasks.serve.logprobs_json``, or None where none were
    # asked for; the text offset of the first entry's token) -> its value in the endpoint's shape.
    logprobs: Callable[[list[dict[str, Any]] | None, int], Any]


async def _complete(request: HttpRequest, endpoint: _Endpoint) -> HttpResponse:
    started = await _start(request, endpoint.schema, endpoint.id_prefix)
    if isinstance(started, HttpResponse):
        return started
    token, body, choice, generation_id = started
    try:
        # Recorded under the lock of the model's row: its deletion is refused until the answer ends.
        await sync_to_async(api_generation_start)(token=token, model=choice, generation_id=generation_id)
    except ValidationError as error:
        return _error(404, f"{' '.join(error.messages)} (GET /v1/models lists them)", code="model_not_found")
    response = None
    try:
        response = await _answer(body, choice, generation_id, endpoint, token_id=token.pk,
                                 project_slug=token.project.slug)
        return response
    finally:
        if not isinstance(response, StreamingHttpResponse):  # a stream ends the record where it ends (_stream)
            await sync_to_async(api_generation_end)(generation_id=generation_id)


async def _answer(body: _Body, choice, generation_id: str, endpoint: _Endpoint, *, token_id: int,
                  project_slug: str) -> HttpResponse:
    """Queue the completion's generations and answer with their outcome, or a stream of it."""
    inputs = endpoint.inputs(body)
    # A task per prompt (a list of prompts); the answer's id is the one task's when there is one.
    task_ids = [generation_id] if len(inputs) == 1 else [f"{generation_id}-{index}" for index in range(len(inputs))]
    for one_id, one_input in zip(task_ids, inputs):
        await sync_to_async(celery_app.send_task)(
            GENERATE_TASK, args=[_request(body, choice, one_id, project_slug=project_slug, **one_input)
                                 | _choices_field(body)], queue="serve", expires=generation_expiry_seconds())
    generation_ids = _choice_ids(task_ids, body.n)
    head = {"id": generation_id, "object": endpoint.chunk_object, "created": int(time.time()), "model": body.model}
    if body.stream:
        texted: set[int] = set()  # the choices whose first text was sent
        offsets = [0] * len(generation_ids)  # each choice's text offset after the tokens whose log probabilities were sent

        include_usage = body.stream_options is not None and body.stream_options.include_usage

        def chunk(index: int, text: str | None, finish_reason: str | None,
                  logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
            if text is None:  # the usage chunk
                return dict(head)
            # The role with a choice's first text, or with its finish where it had none (an empty answer), so that
            # every choice names it once, as OpenAI's do.
            first = index not in texted and (bool(text) or finish_reason is not None)
            part = endpoint.chunk_text(text, first)
            if first:
                texted.add(index)
            logprobs_part = endpoint.logprobs(logprobs, offsets[index])
            offsets[index] += _tokens_length(logprobs or [])
            # With the usage asked for, OpenAI's chunks before the last carry it as null.
            return head | {"choices": [{"index": index, **part, "logprobs": logprobs_part,
                                        "finish_reason": finish_reason}]} | ({"usage": None} if include_usage else {})

        streams = [_events(one_id) for one_id in generation_ids]
        try:
            firsts = await asyncio.gather(*(_first_output(events) for events in streams))
        except asyncio.CancelledError:  # the client went away before the first tokens
            for one_id in generation_ids:
                _stop(one_id)
            raise
        refused = next((index for index, first in enumerate(firsts)
                        if first["type"] in ("error", "unavailable", "unanswered")), None)
        if refused is not None:
            for one_id, first in zip(generation_ids, firsts):
                if first["type"] not in channels.TERMINAL_TYPES:
                    _stop(one_id)
            return _failed(firsts[refused], prompt=_prompt_of_choice(refused, n=body.n, prompts=len(inputs)))
        return _streaming(_AnswerStream(list(zip(generation_ids, firsts, streams)), chunk,
                                        include_usage=include_usage, answer_id=generation_id,
                                        token_id=token_id))
    waits = [asyncio.ensure_future(_final(one_id)) for one_id in generation_ids]
    watch = asyncio.ensure_future(anext(_token_watch(token_id)))
    try:
        pending = set(waits)
        while pending:
            finished, pending = await asyncio.wait(pending | {watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch in finished:
                return _revoked(watch.result())
            pending.discard(watch)
            for wait in finished:
                if wait.result()["type"] != "done":  # the answer is this refusal: the others' text would be lost
                    return _failed(wait.result(),
                                   prompt=_prompt_of_choice(waits.index(wait), n=body.n, prompts=len(inputs)))
    finally:
        watch.cancel()
        for wait in waits:
            wait.cancel()  # stops a generation still going (see _final); nothing for one that ended
        await asyncio.gather(*waits, watch, return_exceptions=True)
    finals = [wait.result() for wait in waits]
    echoes = endpoint.echoes(body)

    def final_choice(index: int, done: dict[str, Any]) -> dict[str, Any]:
        text, entries = done["text"], done.get("logprobs")
        if echoes:  # the prompt's text and its tokens' entries before the answer's
            text = done["prompt_text"] + text
            entries = None if entries is None else [*done.get("prompt_logprobs", []), *entries]
        return {"index": index, **endpoint.final_text(text), "logprobs": endpoint.logprobs(entries, 0),
                "finish_reason": FINISH_REASONS[done["finish_reason"]]}

    return JsonResponse(head | {
        "object": endpoint.final_object,
        "choices": [final_choice(index, done) for index, done in enumerate(finals)],
        "usage": _usage(finals)})


CHAT = _Endpoint(
    schema=ChatBody, id_prefix="chatcmpl", chunk_object="chat.completion.chunk", final_object="chat.completion",
    inputs=lambda body: [{"messages": body.messages}],
    # OpenAI names the role in the first chunk's delta only
    chunk_text=lambda text, first: {"delta": ({"role": "assistant"} if first else {}) | ({"content": text} if text else {})},
    final_text=lambda text: {"message": {"role": "assistant", "content": text}},
    echoes=lambda body: False,
    logprobs=lambda entries, offset: None if entries is None else {"content": entries, "refusal": None},
)


def _tokens_length(entries: list[dict[str, Any]]) -> int:
    return sum(len(entry["token"]) for entry in entries)


def _completion_logprobs(entries: list[dict[str, Any]] | None, offset: int) -> dict[str, Any] | None:
    """OpenAI's legacy completion ``logprobs`` of chat-shaped entries: the tokens, their log probabilities, a
    ``{token: logprob}`` of each one's alternatives (null for an echoed prompt's first token, which nothing
    predicts, as its log probability), and where each token starts in the choice's text (the lengths of the tokens
    before it, from ``offset``, as vLLM counts them)."""
    if entries is None:
        return None
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry["token"])
    return {"tokens": [entry["token"] for entry in entries],
            "token_logprobs": [entry["logprob"] for entry in entries],
            "top_logprobs": [None if entry["top_logprobs"] is None
                             else {top["token"]: top["logprob"] for top in entry["top_logprobs"]} for entry in entries],
            "text_offset": offsets}


TEXT = _Endpoint(
    schema=CompletionBody, id_prefix="cmpl", chunk_object="text_completion", final_object="text_completion",
    inputs=lambda body: [{"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}
                         for prompt in body.prompts],
    chunk_text=lambda text, first: {"text": text},
    final_text=lambda text: {"text": text},
    echoes=lambda body: body.echo,
    logprobs=_completion_logprobs,
)


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    return await _complete(request, CHAT)


@csrf_exempt
async def completions(request: HttpRequest) -> HttpResponse:
    return await _complete(request, TEXT)
