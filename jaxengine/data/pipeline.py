"""From dataset rows to training batches: tokenize, mask, truncate, pack, shuffle, batch.

Design note. Rows are read through ``jaxengine.data.formats`` (the same readers and checks the web
app validates uploads with) and become ``Example`` values: token ids plus a per-token flag saying
whether the model is trained to produce that token. Conversations are rendered with the tokenizer's
chat template. A template with ``{% generation %}`` markers is trained on exactly the marked text, as
transformers' assistant mask is. Otherwise the spans that belong to assistant turns are found by rendering
growing prefixes of the conversation (``template(messages[:i], add_generation_prompt=True)`` is where turn
i starts, ``template(messages[:i + 1])`` where it ends). Where a template renders earlier turns unlike the
latest (Qwen3 drops their reasoning) those prefixes are not where the full rendering begins, and no one
rendering shows every turn as a chat asked for it: each trained turn becomes an example of its own, the
conversation up to it rendered with the generation prompt and then answered (``EncodeStats.split_by_turn``
counts such conversations). Each span is tokenized on its own so the loss mask is exact to the token.
``prompt``/``completion`` rows are a one-turn conversation when the
tokenizer has a chat template, and plain ``bos + prompt + completion + eos`` otherwise; generation
prompts for evaluation are rendered by ``encode_prompt`` with the same rule, so what the model is
asked at eval time is exactly what it saw in training.

Truncation never drops a completion silently: the prompt is cut from the left first (its end, next
to the completion, matters most) down to half the budget, then the completion from the right. Rows
left with no loss token are dropped; every cut and drop is counted in ``EncodeStats``, by row.

Batches are fixed-shape and right-padded. With packing, several examples share a row; each has its
own ``segment_ids`` value (1, 2, ...; 0 is padding), positions restart at 0 per segment, and
``attention_mask`` lets a token see only earlier tokens of its own segment. The example stream is
shuffled per epoch with ``numpy.random.default_rng((seed, epoch))`` and consumed continuously
across epochs, so a ``DataPosition`` (epoch, cursor) is all a checkpoint needs to resume it exactly.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxengine.chat_template import GENERATION_MARKER, ChatTemplateError
from jaxengine.data import formats
# Defined where the web app reaches them without jax; training's own names for them.
from jaxengine.prompts import DataError, as_messages, encode_prompt, with_bos  # noqa: F401 - callers import encode_prompt from here
from jaxengine.spec import TASK_DATASET_KINDS

# Which dataset kind each task reads.
TASK_KINDS: dict[str, formats.DatasetKind] = {task: formats.DatasetKind(kind) for task, kind in TASK_DATASET_KINDS.items()}


class TokenizerLike(Protocol):
    """The part of ``jaxengine.tokenizer.Tokenizer`` the pipeline uses."""

    bos_id: int | None
    eos_ids: list[int]
    pad_id: int | None
    chat_template: str | None

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]: ...

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = False,
                            generation_spans: list[tuple[int, int]] | None = None, **template_kwargs: Any) -> str: ...


# --------------------------------------------------------------------------------------------
# Examples


@dataclass(frozen=True, kw_only=True)
class Example:
    """One tokenized sequence: ``ids`` int32 [N]; ``loss_mask`` bool [N], True where token i is trained on."""

    ids: np.ndarray
    loss_mask: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, kw_only=True)
class PreferencePair:
    """A prompt with a chosen and a rejected continuation, each a whole ``Example``.

    ``reference_chosen``/``reference_rejected``: summed log-probs of each continuation under the
    reference model, filled in once before DPO training (``jaxengine.tasks.with_reference_log_probs``).
    """

    chosen: Example
    rejected: Example
    reference_chosen: float = 0.0
    reference_rejected: float = 0.0

    def __len__(self) -> int:
        return max(len(self.chosen), len(self.rejected))


@dataclass(kw_only=True)
class EncodeStats:
    """What tokenization did to a dataset; reported in the run summary."""

    rows: int = 0
    examples: int = 0
    truncated: int = 0
    dropped: int = 0
    split: int = 0
    # sft conversations trained one assistant turn per example: their template renders earlier turns otherwise
    # than the latest (Qwen3 drops their reasoning), so no one rendering shows every turn as it was asked.
    split_by_turn: int = 0
    # Their tokens: in the examples they became, and rendered whole as one (both before any cut to max_seq_len).
    split_tokens: int = 0
    whole_tokens: int = 0
    tokens: int = 0
    loss_tokens: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def split_by_turn_note(stats: dict[str, int], *, use: str) -> str | None:
    """The run log's line on ``data.<use>``'s conversations trained one assistant turn per example
    (``EncodeStats.to_dict()``'s ``split_by_turn``), or None when there were none."""
    split = stats.get("split_by_turn", 0)
    if not split:
        return None
    tokens = (f"; those conversations take {stats['split_tokens']:,} tokens so, {stats['whole_tokens']:,} whole"
              if "split_tokens" in stats and "whole_tokens" in stats else "")
    return (f"data.{use}: the chat template renders earlier assistant turns otherwise than the latest (Qwen3 drops "
            f"their reasoning), so {split:,} of {stats.get('rows', 0):,} conversations were trained one assistant turn "
            f"per example, each from the prompt a chat sends for that turn ({stats.get('examples', 0):,} examples"
            f"{tokens}); a template with {{% generation %}} markers trains a conversation as one example, and so "
            "does data.loss_on: all (every token trained)")


def _segments_to_example(segments: Sequence[tuple[list[int], bool]]) -> Example:
    ids = [token for tokens, _ in segments for token in tokens]
    mask = [trained for tokens, trained in segments for _ in tokens]
    return Example(ids=np.asarray(ids, np.int32), loss_mask=np.asarray(mask, np.bool_))


Segments = list[tuple[list[int], bool]]  # token spans in order, each flagged True when trained


def _text_segments(tokenizer: TokenizerLike, text: str, trained_spans: Sequence[tuple[int, int]]) -> Segments:
    """``text`` tokenized span by span: the character spans [start, end) of ``trained_spans`` (in order,
    not overlapping) flagged True; each span on its own, so the loss mask is exact to the token."""
    spans: list[tuple[str, bool]] = []
    cursor = 0
    for start, end in trained_spans:
        spans += [(text[cursor:start], False), (text[start:end], True)]
        cursor = end
    spans.append((text[cursor:], False))
    segments = [(tokenizer.encode(piece), trained) for piece, trained in spans if piece]
    if segments:
        segments[0] = (with_bos(tokenizer, segments[0][0]), segments[0][1])
    return segments


def _trained_turns(messages: list[dict], first_trained: int) -> list[int]:
    return [index for index, message in enumerate(messages) if message["role"] == "assistant" and index >= first_trained]


def _marked_segments(tokenizer: TokenizerLike, messages: list[dict], *, first_trained: int) -> Segments:
    """The full rendering trained on exactly its ``{% generation %}`` blocks, as transformers' assistant mask."""
    marked: list[tuple[int, int]] = []
    full = tokenizer.apply_chat_template(messages, generation_spans=marked)
    marked = [(start, end) for start, end in marked if end > start]
    earlier = sum(message["role"] == "assistant" for message in messages[:first_trained])
    if earlier:  # a prompt that holds assistant turns: its blocks are not trained
        turns = earlier + len(_trained_turns(messages, first_trained))
        if len(marked) != turns:
            raise DataError(
                f"the chat template's {{% generation %}} blocks mark {len(marked)} spans in a conversation of {turns} "
                "assistant turns, so the prompt's turns cannot be told from the completion's; give the prompt "
                "without assistant turns, or a template with one block per assistant turn")
        marked = marked[earlier:]
    return _text_segments(tokenizer, full, marked)


def _prefix_segments(tokenizer: TokenizerLike, messages: list[dict], *, first_trained: int) -> Segments | None:
    """The full rendering with its trained assistant turns located by rendering prefixes, or None when the
    template renders a prefix otherwise than the full conversation begins (Qwen3's earlier turns)."""
    full = tokenizer.apply_chat_template(messages)
    boundaries: list[tuple[int, int]] = []  # character spans [start, end) of trained turns
    for index in _trained_turns(messages, first_trained):
        # Templates index messages[0]; a conversation opening with the assistant starts at 0.
        start_text = tokenizer.apply_chat_template(messages[:index], add_generation_prompt=True) if index else ""
        end_text = tokenizer.apply_chat_template(messages[: index + 1])
        if not (full.startswith(start_text) and full.startswith(end_text) and len(start_text) <= len(end_text)):
            return None
        boundaries.append((len(start_text), len(end_text)))
    return _text_segments(tokenizer, full, boundaries)


def _turn_segments(tokenizer: TokenizerLike, messages: list[dict], index: int) -> Segments:
    """The conversation up to assistant turn ``index``, rendered as a chat asks for that turn (the history
    with the generation prompt) and then answered, trained on that turn alone."""
    prompt = tokenizer.apply_chat_template(messages[:index], add_generation_prompt=True) if index else ""
    answered = tokenizer.apply_chat_template(messages[: index + 1])
    if not answered.startswith(prompt):
        agree = len(os.path.commonprefix([prompt, answered]))
        raise DataError(
            f"message {index + 1} (assistant): the chat template asks for this turn with a prompt ending "
            f"{prompt[max(0, agree - 20):][:50]!r} but renders the turn as {answered[max(0, agree - 20):][:50]!r}, "
            "so the model would learn it from a prompt no chat sends; make the turn and the template variables "
            "(data.chat_template_kwargs) agree (Qwen3: no reasoning in a turn while enable_thinking is false)")
    return _text_segments(tokenizer, answered, [(len(prompt), len(answered))])


def _chat_examples(tokenizer: TokenizerLike, messages: list[dict], *, first_trained: int,
                   loss_on: str = "completion") -> tuple[list[Segments], bool]:
    """The examples of a conversation, trained on its assistant turns from ``first_trained`` on, and whether
    it was split into one example per trained turn.

    A template with ``{% generation %}`` markers: the full rendering, trained on the marked text. Otherwise
    the turns are found by rendering prefixes (one example). A template that renders earlier turns unlike
    the latest (Qwen3 drops their reasoning) has no such prefixes: each trained turn becomes an example of
    its own, the conversation up to it as a chat renders it then, so the model learns every turn from the
    very prompt it is asked with. ``loss_on: all`` trains the full rendering, locating no turn."""
    if GENERATION_MARKER.search(tokenizer.chat_template or ""):
        return [_marked_segments(tokenizer, messages, first_trained=first_trained)], False
    segments = _prefix_segments(tokenizer, messages, first_trained=first_trained)
    if segments is not None:
        return [segments], False
    if loss_on == "all":
        return [_text_segments(tokenizer, tokenizer.apply_chat_template(messages), [])], False
    return [_turn_segments(tokenizer, messages, index) for index in _trained_turns(messages, first_trained)], True


def _single_example(examples: tuple[list[Segments], bool], what: str) -> Segments:
    """The one example of a preference side: pairs are compared whole, never split by turn."""
    segments, by_turn = examples
    if by_turn:
        raise DataError(
            f"{what}: the chat template renders earlier assistant turns otherwise than the latest (Qwen3 drops "
            "their reasoning), so a conversation with several assistant turns cannot be scored whole; give the "
            "shared turns as the row's prompt and one assistant turn per side, or a template with "
            "{% generation %} markers")
    return segments[0]


def _completion_examples(
    tokenizer: TokenizerLike, prompt: str | list[dict], completion: str | list[dict], *, loss_on: str = "completion"
) -> tuple[list[Segments], bool]:
    """Prompt span (untrained) then completion span(s) (trained), chat-templated when possible."""
    if tokenizer.chat_template:
        prompt_messages = as_messages(prompt, "user")
        messages = prompt_messages + as_messages(completion, "assistant")
        return _chat_examples(tokenizer, messages, first_trained=len(prompt_messages), loss_on=loss_on)
    if not (isinstance(prompt, str) and isinstance(completion, str)):
        raise DataError("conversations (message lists) need a tokenizer with a chat template")
    prompt_ids = with_bos(tokenizer, tokenizer.encode(prompt))
    completion_ids = tokenizer.encode(completion) + tokenizer.eos_ids[:1]
    return [[(prompt_ids, False), (completion_ids, True)]], False


def _truncate(segments: list[tuple[list[int], bool]], max_len: int) -> tuple[list[tuple[list[int], bool]], bool]:
    """Fit ``segments`` into ``max_len`` tokens: trim the untrained prefix from the left, then the tail."""
    total = sum(len(tokens) for tokens, _ in segments)
    if total <= max_len:
        return segments, False
    first_trained = next((i for i, (_, trained) in enumerate(segments) if trained), len(segments))
    prefix = [token for tokens, _ in segments[:first_trained] for token in tokens]
    rest_len = total - len(prefix)
    # The prompt keeps at least half the budget (its end), or more when the completion is short.
    keep_prefix = min(len(prefix), max(max_len - rest_len, max_len // 2))
    kept: list[tuple[list[int], bool]] = [(prefix[len(prefix) - keep_prefix:], False)] if keep_prefix else []
    budget = max_len - keep_prefix
    for tokens, trained in segments[first_trained:]:
        if budget <= 0:
            break
        kept.append((tokens[:budget], trained))
        budget -= len(tokens[:budget])
    return kept, True


def _encode_sft_row(tokenizer: TokenizerLike, row: dict, loss_on: str) -> tuple[list[Segments], bool]:
    if "messages" in row:
        examples, by_turn = _chat_examples(tokenizer, row["messages"], first_trained=0, loss_on=loss_on)
    else:
        examples, by_turn = _completion_examples(tokenizer, row["prompt"], row["completion"], loss_on=loss_on)
    if loss_on == "all":
        examples = [[(tokens, True) for tokens, _ in segments] for segments in examples]
    return examples, by_turn


def _whole_rendering(tokenizer: TokenizerLike, row: dict) -> list[int]:
    """The token ids of an sft row's conversation rendered whole, as one example would hold it."""
    messages = (row["messages"] if "messages" in row
                else as_messages(row["prompt"], "user") + as_messages(row["completion"], "assistant"))
    return with_bos(tokenizer, tokenizer.encode(tokenizer.apply_chat_template(messages)))


def _encode_row(row: dict, *, task: str, tokenizer: TokenizerLike, max_seq_len: int, loss_on: str,
                stats: EncodeStats) -> list:
    """The examples of one row for ``task`` (its truncation and split counted in ``stats``)."""
    if task == "pretrain":
        ids = with_bos(tokenizer, tokenizer.encode(row["text"])) + tokenizer.eos_ids[:1]
        windows = [ids[i : i + max_seq_len] for i in range(0, len(ids), max_seq_len)]
        stats.split += len(windows) > 1
        # A one-token tail window predicts nothing; drop it.
        encoded = [_segments_to_example([(w, True)]) for w in windows if len(w) > 1]
    elif task == "sft":
        examples, by_turn = _encode_sft_row(tokenizer, row, loss_on)
        stats.split_by_turn += by_turn
        if by_turn:
            stats.split_tokens += sum(len(tokens) for segments in examples for tokens, _ in segments)
            stats.whole_tokens += len(_whole_rendering(tokenizer, row))
        cut = [_truncate(segments, max_seq_len) for segments in examples]
        stats.truncated += any(was_cut for _, was_cut in cut)
        encoded = [_segments_to_example(segments) for segments, _ in cut]
    elif task in ("reward", "dpo"):
        pair = []
        cut_any = False
        for side in ("chosen", "rejected"):
            if row.get("prompt") is None:  # whole conversations: train on their assistant turns
                examples = _chat_examples(tokenizer, row[side], first_trained=0)
            else:
                examples = _completion_examples(tokenizer, row["prompt"], row[side])
            segments, was_cut = _truncate(_single_example(examples, side), max_seq_len)
            cut_any |= was_cut
            pair.append(_segments_to_example(segments))
        stats.truncated += cut_any
        encoded = [PreferencePair(chosen=pair[0], rejected=pair[1])]
    else:
        raise DataError(f"task {task!r} has no data encoding; expected one of {', '.join(TASK_KINDS)}")
    return encoded


def preference_lengths(row: dict, *, tokenizer: TokenizerLike) -> tuple[int, int]:
    """The token counts of a preference row's (``formats.iter_examples``' example) chosen and rejected sequences as a
    dpo or reward run encodes them, each with the prompt before it, before any cut to ``data.max_seq_len``: the
    lengths that setting is compared with."""
    [pair] = _encode_row(row, task="dpo", tokenizer=tokenizer, max_seq_len=sys.maxsize, loss_on="completion",
                         stats=EncodeStats())
    return len(pair.chosen), len(pair.rejected)


def check_vocabulary(examples: Sequence[Example | PreferencePair], vocab_size: int, *, where: str) -> None:
    """DataError when a token id of ``examples`` (one row's) is past the model's embedding: a tokenizer not the
    model's own. Unchecked, the embedding lookup clamped such ids and the run failed at its first step with a
    NaN loss blamed on the learning rate."""
    parts = [part for example in examples
             for part in ((example.chosen, example.rejected) if isinstance(example, PreferencePair) else (example,))]
    largest = max((int(part.ids.max()) for part in parts if len(part)), default=-1)
    if largest >= vocab_size:
        raise DataError(f"{where}: token id {largest} is outside the model's vocabulary (vocab_size={vocab_size} "
                        "in its config.json): the tokenizer is not the model's own; give the model directory its "
                        "own tokenizer files")


def encode_rows(
    rows: Iterator[dict] | Sequence[dict],
    *,
    task: str,
    tokenizer: TokenizerLike,
    max_seq_len: int,
    loss_on: str = "completion",
    source: str | Path | None = None,
    vocab_size: int | None = None,
) -> tuple[list[Example] | list[PreferencePair], EncodeStats]:
    """Tokenize dataset examples (as ``formats.iter_examples`` yields them) for ``task``; ``source``, the
    rows' file, is named in the error for a row the model's chat template refuses, and with ``vocab_size``
    (the model's) for a row whose token ids the model has no embedding for.

    pretrain: ``bos + text + eos``, long texts split into ``max_seq_len`` windows, loss on every token.
    sft: see the module notes. reward/dpo: a ``PreferencePair`` per row, loss on the continuation.
    """
    stats = EncodeStats()
    examples: list = []
    for row in rows:
        stats.rows += 1
        where = f"{source}: row {stats.rows}" if source is not None else f"row {stats.rows}"
        try:
            encoded = _encode_row(row, task=task, tokenizer=tokenizer, max_seq_len=max_seq_len, loss_on=loss_on,
                                  stats=stats)
        except ChatTemplateError as error:
            # A template may refuse some rows only (Gemma's raise on a system turn): name the row, as a
            # traceback from the middle of the data did not (the error names the template's file).
            raise DataError(f"{where}: {error}; change the row or the model's chat template") from None
        except DataError as error:  # a row whose turns cannot be located for the loss mask
            raise DataError(f"{where}: {error}") from None
        if vocab_size is not None:
            check_vocabulary(encoded, vocab_size, where=where)
        kept = 0
        for example in encoded:
            parts = (example.chosen, example.rejected) if isinstance(example, PreferencePair) else (example,)
            # Loss on token 0 is never computed (nothing predicts it), so it does not count.
            if any(not part.loss_mask[1:].any() for part in parts):
                continue
            kept += 1
            examples.append(example)
            stats.examples += 1
            stats.tokens += sum(len(part) for part in parts)
            stats.loss_tokens += sum(int(part.loss_mask[1:].sum()) for part in parts)
        # Counted by row, as truncation is: a conversation split by turn is one row of several examples.
        stats.dropped += bool(encoded) and not kept
    return examples, stats


def spec_source(key: str, task: str, entry: formats.Entry = formats.Entry.SPEC) -> formats.DataSource:
    """A job spec's data file, ``key`` (data.train, data.eval) of a ``task`` job, given in ``entry``: its problems
    name spec keys (``Entry.SPEC``, jaxengine train), or the launch form's settings (``Entry.LAUNCH``, a run launched
    in the web app, whose worker trains the spec Temper resolved)."""
    return formats.DataSource(entry=entry, key=key, task=task)


def read_examples(path: str | Path, *, kind: str, columns: dict[str, str] | None = None,
                  source: formats.DataSource | None = None) -> Iterator[dict[str, Any]]:
    """Stream the rows of a dataset file of ``kind`` (text | sft | preference | prompts; ``TASK_KINDS``
    maps tasks to kinds), checked by ``jaxengine.data.formats``; ``columns`` maps the kind's fields to
    the file's column names (fields left out keep their own names). ``source``: where the file was given
    (default: a job spec's data file), whose settings the advice of a problem names. A bad row stops the rows; the
    DataError names it and the next bad rows, up to ``formats.ROWS_SHOWN`` in all, and counts the rest."""
    source = source or formats.DataSource(entry=formats.Entry.SPEC)
    try:
        fmt = formats.detect_format(str(path), source=source)
    except ValueError as error:  # no extension it can read
        raise DataError(str(error)) from None
    try:
        mapping = formats.ColumnMapping(kind=kind, columns=columns or {})
        yield from formats.iter_examples(path, fmt=fmt, mapping=mapping, source=source,
                                         rows_named=formats.ROWS_SHOWN)
    except formats.DatasetFormatError as error:
        raise DataError(f"{path}: {error}", row=error.issue.row) from None


# --------------------------------------------------------------------------------------------
# Batches


@jax.tree_util.register_dataclass
@dataclass(frozen=True, kw_only=True)
class TokenBatch:
    """A right-padded batch of (possibly packed) sequences; every field is [B, T].

    ``input_ids`` int32; ``targets`` int32, the next token within the same segment; ``loss_mask``
    bool, True where ``targets`` is trained on; ``segment_ids`` int32, 1.. per packed example and 0
    on padding; ``positions`` int32, restarting at 0 in each segment.
    """

    input_ids: jax.Array
    targets: jax.Array
    loss_mask: jax.Array
    segment_ids: jax.Array
    positions: jax.Array


@jax.tree_util.register_dataclass
@dataclass(frozen=True, kw_only=True)
class PreferenceBatch:
    """Chosen and rejected sequences of the same prompts, row for row (unpacked, right-padded, same width),
    with the reference model's summed log-probs of each continuation, float32 [B]."""

    chosen: TokenBatch
    rejected: TokenBatch
    reference_chosen: jax.Array
    reference_rejected: jax.Array


def attention_mask(segment_ids_bt: jax.Array) -> jax.Array:
    """Bool [B, T, T]: query t sees key s iff s <= t and both lie in the same segment.

    Padding (segment 0) attends within the padding, so no query row is fully masked.
    """
    length = segment_ids_bt.shape[-1]
    causal_tt = jnp.tril(jnp.ones((length, length), jnp.bool_))
    same_segment_btt = segment_ids_bt[:, :, None] == segment_ids_bt[:, None, :]
    return same_segment_btt & causal_tt[None]


def last_token_index(batch: TokenBatch) -> jax.Array:
    """Int32 [B]: the index of each row's last real token (rows are unpacked and right-padded)."""
    return jnp.maximum(jnp.sum(batch.segment_ids > 0, axis=-1) - 1, 0).astype(jnp.int32)


def pad_length(longest: int, max_seq_len: int) -> int:
    """Padded row length: the next power of two >= ``longest`` (at least 16), capped at max_seq_len.

    A handful of static shapes keeps recompilation rare while short datasets stay cheap.
    """
    return min(max_seq_len, max(16, 1 << max(0, longest - 1).bit_length()))


def rows_to_batch(rows: Sequence[Sequence[Example]], *, length: int, pad_id: int) -> TokenBatch:
    """Lay out ``rows`` (each a list of examples packed left to right) as a ``TokenBatch`` of width ``length``."""
    batch = len(rows)
    input_ids = np.full((batch, length), pad_id, np.int32)
    targets = np.full((batch, length), pad_id, np.int32)
    loss_mask = np.zeros((batch, length), np.bool_)
    segment_ids = np.zeros((batch, length), np.int32)
    positions = np.zeros((batch, length), np.int32)
    for b, row in enumerate(rows):
        offset = 0
        for segment, example in enumerate(row, start=1):
            n = len(example)
            if offset + n > length:
                raise DataError(f"row {b} needs {offset + n} tokens but the batch is {length} wide")
            span = slice(offset, offset + n)
            input_ids[b, span] = example.ids
            # Position i predicts token i + 1 of the same example; the last position predicts nothing.
            targets[b, offset : offset + n - 1] = example.ids[1:]
            loss_mask[b, offset : offset + n - 1] = example.loss_mask[1:]
            segment_ids[b, span] = segment
            positions[b, span] = np.arange(n)
            offset += n
    return TokenBatch(input_ids=input_ids, targets=targets, loss_mask=loss_mask, segment_ids=segment_ids,
                      positions=positions)


def pack(examples: Sequence[Example], *, length: int) -> list[list[Example]]:
    """Greedy packing in order: start a new row whenever the next example does not fit."""
    rows: list[list[Example]] = []
    used = length
    for example in examples:
        if used + len(example) > length:
            rows.append([])
            used = 0
        rows[-1].append(example)
        used += len(example)
    return rows


@dataclass(frozen=True, kw_only=True)
class DataPosition:
    """Where the training stream is: ``cursor`` examples of epoch ``epoch``'s order consumed."""

    epoch: int = 0
    cursor: int = 0


def epoch_order(num_examples: int, *, seed: int, epoch: int) -> np.ndarray:
    """The example order of one epoch: a permutation fixed by (seed, epoch)."""
    return np.random.default_rng((seed, epoch)).permutation(num_examples)


def examples_drawn(num_examples: int, *, seed: int, draws: int) -> np.ndarray:
    """The sorted indices of the examples that the first ``draws`` draws of an unpacked ``BatchStream``
    (from the start, ``seed``) read: all of them once the draws reach an epoch."""
    if draws >= num_examples:
        return np.arange(num_examples)
    return np.sort(epoch_order(num_examples, seed=seed, epoch=0)[:draws])


@dataclass(kw_only=True)
class BatchStream:
    """An endless, resumable stream of training batches over shuffled epochs.

    Each ``next_batch()`` takes ``batch_size`` rows; a row is one example or, with ``packing``, as
    many consecutive examples as fit in ``max_seq_len``. ``position`` after a batch says where the
    next one starts, and a stream built with that position continues identically.
    """

    examples: Sequence[Example] | Sequence[PreferencePair]
    batch_size: int
    max_seq_len: int
    pad_id: int
    seed: int
    packing: bool = False
    position: DataPosition = field(default_factory=DataPosition)

    def __post_init__(self) -> None:
        if not self.examples:
            raise DataError("the training set has no usable examples (all rows were empty or dropped)")
        self._order = epoch_order(len(self.examples), seed=self.seed, epoch=self.position.epoch)

    def _take(self) -> Example | PreferencePair:
        if self.position.cursor >= len(self.examples):
            self.position = DataPosition(epoch=self.position.epoch + 1, cursor=0)
            self._order = epoch_order(len(self.examples), seed=self.seed, epoch=self.position.epoch)
        example = self.examples[self._order[self.position.cursor]]
        self.position = dataclasses.replace(self.position, cursor=self.position.cursor + 1)
        return example

    def _peek_length(self) -> int:
        if self.position.cursor >= len(self.examples):
            return len(self.examples[epoch_order(len(self.examples), seed=self.seed, epoch=self.position.epoch + 1)[0]])
        return len(self.examples[self._order[self.position.cursor]])

    def next_batch(self) -> TokenBatch | PreferenceBatch:
        """The next batch (numpy arrays; ``jax.device_put`` it where it should live)."""
        if self.packing:
            rows: list[list[Example]] = []
            for _ in range(self.batch_size):
                row = [self._take()]
                used = len(row[0])
                while used + self._peek_length() <= self.max_seq_len:
                    row.append(self._take())
                    used += len(row[-1])
                rows.append(row)
            return rows_to_batch(rows, length=self.max_seq_len, pad_id=self.pad_id)
        picked = [self._take() for _ in range(self.batch_size)]
        return make_batch(picked, max_seq_len=self.max_seq_len, pad_id=self.pad_id)


def make_batch(
    examples: Sequence[Example] | Sequence[PreferencePair], *, max_seq_len: int, pad_id: int
) -> TokenBatch | PreferenceBatch:
    """One example per row, padded to ``pad_length`` of the longest (both sides alike for pairs)."""
    length = pad_length(max(len(example) for example in examples), max_seq_len)
    if isinstance(examples[0], PreferencePair):
        return PreferenceBatch(
            chosen=rows_to_batch([[pair.chosen] for pair in examples], length=length, pad_id=pad_id),
            rejected=rows_to_batch([[pair.rejected] for pair in examples], length=length, pad_id=pad_id),
            reference_chosen=np.asarray([pair.reference_chosen for pair in examples], np.float32),
            reference_rejected=np.asarray([pair.reference_rejected for pair in examples], np.float32),
        )
    return rows_to_batch([[example] for example in examples], length=length, pad_id=pad_id)


def stack_batches(batches: Sequence[TokenBatch | PreferenceBatch], *, pad_id: int) -> TokenBatch | PreferenceBatch:
    """Micro-batches of one optimizer step stacked on a new leading axis [A, B, T], right-padded to one width."""
    width = max(leaf.shape[-1] for batch in batches for leaf in jax.tree.leaves(batch))

    def widen(name: str, array: np.ndarray) -> np.ndarray:
        fill = pad_id if name in ("input_ids", "targets") else 0
        return np.pad(np.asarray(array), ((0, 0), (0, width - array.shape[-1])), constant_values=fill)

    def widen_batch(batch: TokenBatch) -> TokenBatch:
        return TokenBatch(**{f.name: widen(f.name, getattr(batch, f.name)) for f in dataclasses.fields(TokenBatch)})

    if isinstance(batches[0], PreferenceBatch):
        widened = [dataclasses.replace(b, chosen=widen_batch(b.chosen), rejected=widen_batch(b.rejected))
                   for b in batches]
    else:
        widened = [widen_batch(b) for b in batches]
    return jax.tree.map(lambda *leaves: np.stack(leaves), *widened)


def eval_batches(
    examples: Sequence[Example] | Sequence[PreferencePair], *, batch_size: int, max_seq_len: int, pad_id: int
) -> Iterator[TokenBatch | PreferenceBatch]:
    """The eval set once, in order. The last batch of sequences is filled with empty rows (no loss
    tokens, so no weight); the last batch of pairs is just shorter, since pair losses are row means."""
    for start in range(0, len(examples), batch_size):
        chunk = list(examples[start : start + batch_size])
        if not isinstance(chunk[0], PreferencePair):
            empty = Example(ids=np.zeros((1,), np.int32), loss_mask=np.zeros((1,), np.bool_))
            chunk += [empty] * (batch_size - len(chunk))
        yield make_batch(chunk, max_seq_len=max_seq_len, pad_id=pad_id)


def count_rows_per_epoch(examples: Sequence[Example], *, max_seq_len: int, packing: bool, seed: int) -> int:
    """Batch rows one epoch yields: the example count, or the packed row count of epoch 0's order."""
    if not packing:
        return len(examples)
    order = epoch_order(len(examples), seed=seed, epoch=0)
    return len(pack([examples[i] for i in order], length=max_seq_len))
