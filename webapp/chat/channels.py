"""Redis names and events shared by the web process and the serve worker for one generation.

A generation (a chat message, an API completion) has an id. The serve worker appends every event to
the list ``events_key(id)`` (kept ``EVENTS_TTL_SECONDS``) and publishes it on ``channel(id)``; each
event is a JSON object with a ``seq`` (0, 1, ...) and a ``type``:

- ``status``: ``message``, before any token, while the worker loads the generation's model (the
  first answer from it since the worker started); pages show it where the answer will stream;
- ``token``: ``text`` (the new text; may be empty while a multi-byte character is incomplete or a
  possible stop string is held back) and ``tokens`` (how many tokens it adds: the first event one, the
  prefill's; then those of one decode call each, up to the batch's ``steps_per_call``, 8, fewer where the
  answer ends; read back from the device at one moment, so sending them together delays none of them),
  and, where the request asked for log probabilities (``logprobs``: how many alternatives), ``logprobs``:
  one entry per token, shaped as OpenAI's chat ``logprobs.content`` entries (``token``, ``bytes``,
  ``logprob``, ``top_logprobs``: that many ``{token, bytes, logprob}``; ``worker.tasks.serve.logprobs_json``);
- ``prompt``: an echo's (``/v1/completions``' ``echo``), before the first token: ``text`` (the prompt as sent, or
  the text of the token ids sent, special tokens included: ``worker.tasks.serve.echoed_text``),
  ``tokens`` (its tokens) and, where log probabilities were asked for, ``logprobs``: an entry per prompt token as
  above, the first's ``logprob`` and ``top_logprobs`` null (nothing comes before it to predict it);
- ``done``: ``text`` (the whole answer), ``finish_reason`` (``stop`` | ``length`` | ``cancelled`` |
  ``timeout``), ``prompt_tokens``, ``completion_tokens``, ``first_token_seconds``, ``choice`` (its place
  among a request's ``n`` answers; absent for a request of one), ``logprobs`` (every token's, as above)
  where asked, and an echo's ``prompt_text`` (its ``prompt`` event's ``text``) and ``prompt_logprobs`` (its
  ``logprobs``) where asked;
- ``error``: ``message`` (what went wrong, for the user), and ``code`` ``context_length_exceeded`` when
  the prompt and the tokens asked for do not fit the model's context.

A request for ``n`` > 1 answers (a ``/v1`` request's ``n``) is one serve task whose answers are generations of
their own, ids ``choice_id(id, i)``: each has its tokens and ``done``, and every one gets the request's ``status``
and ``error`` events; a stop asked for any of them, or for ``id``, stops them all.

A reader subscribes first, then reads the list, then keeps channel events whose ``seq`` is past the
last one read: nothing is missed and nothing repeats, however late it arrives. ``stop_key(id)``,
set by the web process (``request_stop``), asks the worker to end the generation with the tokens
already sent (it is read between decode calls). Jax-free: the web imports it.

Models deleted (a run, a base model unregistered, a project) are named in the set ``DELETED_MODELS_KEY``
(``models_deleted``, on the deletion's commit) and announced on ``DELETED_MODELS_CHANNEL``; every serve
worker reads the set when the announcement wakes it, and every few seconds in case it missed one (its
connection lost), and drops the weights and batching servers of the models named
(``worker.tasks.serve.drop_deleted_models``).
"""
from __future__ import annotations

import json
from typing import Any

EVENTS_TTL_SECONDS = 3600
STOP_TTL_SECONDS = 3600
TERMINAL_TYPES = ("done", "error")
DELETED_MODELS_KEY = "serve:deleted-models"
DELETED_MODELS_CHANNEL = "serve:deleted-models:announced"
# Kept a day after the last deletion: a serve worker reads it every few seconds, and one that was down
# meanwhile starts with no model loaded.
DELETED_MODELS_TTL_SECONDS = 86400


def channel(generation_id: str) -> str:
    return f"chat:{generation_id}"


def events_key(generation_id: str) -> str:
    return f"chat:{generation_id}:events"


def choice_id(generation_id: str, index: int) -> str:
    """The generation id of answer ``index`` of a request for several (``GenerateRequest.n``)."""
    return f"{generation_id}-{index}"


def stop_key(generation_id: str) -> str:
    return f"chat:{generation_id}:stop"


def request_stop(client, generation_id: str) -> None:
    """Ask the serve worker to stop this generation (it ends with ``finish_reason`` ``cancelled``)."""
    client.set(stop_key(generation_id), "1", ex=STOP_TTL_SECONDS)


def emit(client, generation_id: str, event: dict[str, Any], *, read_stop: bool = False) -> bool | None:
    """Append ``event`` (with its ``seq``) to the generation's list and publish it, in one round trip;
    ``read_stop``: also read whether a stop was asked for (returned), in the same round trip."""
    data = json.dumps(event)
    pipe = client.pipeline(transaction=False)  # in order on one connection; a reader needs no more (above)
    pipe.rpush(events_key(generation_id), data)
    pipe.expire(events_key(generation_id), EVENTS_TTL_SECONDS)
    pipe.publish(channel(generation_id), data)
    if read_stop:
        pipe.exists(stop_key(generation_id))
    replies = pipe.execute()
    return bool(replies[-1]) if read_stop else None


def stored_events(client, generation_id: str) -> list[dict[str, Any]]:
    """Every event emitted so far, in order."""
    return [json.loads(raw) for raw in client.lrange(events_key(generation_id), 0, -1)]


def models_deleted(client, refs: list[str]) -> int:
    """Name models deleted (``bm_…``, ``run_…``: a run's checkpoints go with it) for the serve workers; returns
    how many were listening, and so told at once (the others find the names at their next poll)."""
    if not refs:
        return 0
    pipe = client.pipeline(transaction=False)
    pipe.sadd(DELETED_MODELS_KEY, *refs)
    pipe.expire(DELETED_MODELS_KEY, DELETED_MODELS_TTL_SECONDS)
    pipe.publish(DELETED_MODELS_CHANNEL, json.dumps(refs))  # after the set: a worker woken finds them there
    return pipe.execute()[-1]


def deleted_models(client) -> set[str]:
    """The models named by ``models_deleted`` in the last ``DELETED_MODELS_TTL_SECONDS``."""
    return {ref.decode() for ref in client.smembers(DELETED_MODELS_KEY)}
