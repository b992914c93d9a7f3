"""Prompts as the model reads them: a conversation rendered with its chat template and encoded, with the BOS token
the template did not write, and the chat panel's way with a conversation past the model's context (its oldest turns
left out). Training (``jaxengine.data.pipeline``), the serve worker (``worker.tasks.serve``) and the web app's
conversation page (which shows what the worker encodes) all call these, so this module does not import jax.
"""
from __future__ import annotations

from typing import Any


class DataError(ValueError):
    """A dataset that cannot be turned into training examples; the message says where and why. ``row``: the
    1-based row it stopped at, where there is one (None for a problem of the whole file)."""

    def __init__(self, message: str, *, row: int | None = None):
        super().__init__(message)
        self.row = row


class PromptError(ValueError):
    """A prompt the model cannot take (empty, ids outside its vocabulary, too long for its context)."""


class ContextLengthError(PromptError):
    """A prompt that, with the tokens asked for, does not fit the model's context (OpenAI's error code
    ``context_length_exceeded``)."""


def vocabulary_problem(prompt_ids, *, vocab_size: int, prompt: int | None = None) -> str | None:
    """That a token id of ``prompt_ids`` is outside a vocabulary of ``vocab_size`` ids, naming the first by its index
    and the range to give (``prompt``: its prompt's place in a list of them), or None. The serve worker's check
    (``BatchDecoder.check_prompt``), and the web's before it sends a ``/v1/completions`` prompt of token ids where the
    model's config.json states its size."""
    if min(prompt_ids) >= 0 and max(prompt_ids) < vocab_size:
        return None
    index = next(index for index, token_id in enumerate(prompt_ids) if not 0 <= token_id < vocab_size)
    which = "" if prompt is None else f" of prompt {prompt}"
    # Named by its place: a prompt sent as token ids (/v1/completions) is mended where it was made.
    return (f"prompt: the token id at index {index}{which}, {prompt_ids[index]}, is outside the model's vocabulary; "
            f"give token ids from 0 to {vocab_size - 1} (its vocab_size is {vocab_size})")


def with_bos(tokenizer, ids: list[int]) -> list[int]:
    # Templates such as Llama 3's and Gemma's render the BOS token themselves; never add a second.
    if tokenizer.bos_id is None or (ids and ids[0] == tokenizer.bos_id):
        return ids
    return [tokenizer.bos_id, *ids]


def as_messages(value: str | list[dict], role: str) -> list[dict]:
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)


def encode_prompt(tokenizer, prompt: str | list[dict], **template_kwargs: Any) -> list[int]:
    """Token ids that ask the model for a completion of ``prompt``, rendered exactly as in training;
    ``template_kwargs`` (a chat request's) over the tokenizer's own template variables."""
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(as_messages(prompt, "user"), add_generation_prompt=True,
                                             **template_kwargs)
        return with_bos(tokenizer, tokenizer.encode(text))
    if not isinstance(prompt, str):
        raise DataError("conversations (message lists) need a tokenizer with a chat template")
    return with_bos(tokenizer, tokenizer.encode(prompt))


def fitted_conversation(tokenizer, messages: list[dict], *, context: int, max_new_tokens: int,
                        **template_kwargs: Any) -> tuple[list[dict], list[int]]:
    """(the turns kept, their prompt ids) of ``messages`` for an answer of ``max_new_tokens`` within ``context``
    tokens, as chat panels do: a conversation whose prompt and answer would overflow leaves out its oldest turns (the
    system prompt and the last message stay; what is left starts with a user turn, as chat templates expect). A last
    message that fills the context alone is a ``ContextLengthError`` naming its length, or the system prompt when no
    message would fit after it."""
    ids = encode_prompt(tokenizer, messages, **template_kwargs)
    if len(ids) + max_new_tokens <= context:
        return list(messages), ids
    system = [message for message in messages[:1] if message["role"] == "system"]
    turns = list(messages[len(system):])
    while len(ids) + max_new_tokens > context and len(turns) > 1:
        turns = turns[1:]
        while len(turns) > 1 and turns[0]["role"] != "user":
            turns = turns[1:]
        ids = encode_prompt(tokenizer, system + turns, **template_kwargs)
    if len(ids) >= context:
        if system and turns:
            # With no message at all it does not fit either: no shorter message helps, and a chat page's system
            # prompt is its conversation's for good.
            before_any_message = encode_prompt(tokenizer, system + [{**turns[-1], "content": ""}], **template_kwargs)
            if len(before_any_message) >= context:
                raise ContextLengthError(
                    f"the system prompt ({len(before_any_message)} tokens with the chat template) fills the model's "
                    f"context ({context} tokens) on its own; start a new conversation with a shorter system prompt")
        raise ContextLengthError(f"the message ({len(ids)} tokens with the chat template and system prompt) fills "
                                 f"the model's context ({context} tokens) on its own; send a shorter one")
    return system + turns, ids
