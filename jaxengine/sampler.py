"""Batched generation with a KV cache: prefill, then a decode loop that runs on the device.

Design note.

* Static shapes. A batch is left-padded to ``[B, T]`` and the cache has ``S`` slots, where B, T and
  ``S ≥ T + max_new_tokens`` are rounded up to length buckets (powers of two, at least
  ``min_bucket``). Everything else — prompt lengths, max_new_tokens, temperature, top-k, top-p, seed,
  stop ids — enters the compiled function as data, so calls that land in the same buckets reuse one
  executable. Only the sampling mode (greedy / sampling / sampling with top-k or top-p filtering) and
  whether a host callback is needed are compile-time switches.
* One device call per generate(). Prefill and the whole decode loop (``jax.lax.while_loop``, which
  stops as soon as every row is done) are one jitted function: no host round trip per token. Measured
  on CPU against a host loop around a jitted, cache-donating decode step, the device loop was faster
  (figures in bench/RESULTS.md). Streaming and stop strings need the host once per token: then the
  loop calls ``jax.experimental.io_callback`` with the new tokens, and the callback returns which
  rows a stop string ended (its result feeds the loop state, which keeps the calls in order).
* Masks. Row b has ``pad_b`` padding slots in front. Query t of the prefill sees slots
  ``pad_b ≤ s ≤ t``; a decode step writing slot ``i`` sees slots ``pad_b ≤ s ≤ i``. Rotary positions
  count real tokens only, so a padded prompt gets the same positions as an unpadded one.
* Sampling. Temperature 0 is greedy (argmax). Otherwise logits are divided by the temperature, then
  top-k keeps the k largest (0 = off), then top-p keeps the smallest set of most likely tokens whose
  probability reaches p (1 = off), and a token is drawn. Ties at a threshold are kept. Random keys are
  ``fold_in(fold_in(key(seed), row), step)``: the same seed and batch give the same output.
* Penalties and bias (OpenAI's): before temperature and filters, ``logit_bias`` is added to its tokens'
  logits and ``logits[t] -= presence_penalty * (count[t] > 0) + frequency_penalty * count[t]``, ``count``
  being how often t was generated so far in that row (a [B, V] array in the loop state, the prompt not
  counted). Their values are data; whether any request uses them is a compile-time switch, so a call
  without them carries no count array.
* Logprobs are those of the generated tokens under the model's own distribution
  (``log_softmax(logits)``, before temperature and filtering), i.e. what a trainer recomputes for
  the policy.
* Stopping. A row stops at a stop id (the tokenizer's ``eos_ids`` plus ``stop_token_ids``; the stop
  token is kept in ``token_ids`` and ``logprobs``), at a stop string (the text is cut before it; the
  tokens up to the one that completed it are kept), or after ``max_new_tokens`` (finish_reason
  ``length``).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import io_callback

from jaxengine.losses import token_log_probs
from jaxengine.programs import PROGRAMS
from jaxengine.prompts import ContextLengthError, PromptError  # noqa: F401 - jax-free, for the web app too
from jaxengine.tokenizer import IncrementalDecoder, Tokenizer

OnToken = Callable[[int, int, str], None]  # (row index, token id, text delta)

_STOP_ID_SLOTS = 8  # stop-id arrays are padded to a multiple of this so their length rarely changes


# OpenAI's ranges: penalties in [-2, 2], a token's bias in [-100, 100] (-100 bans it, 100 all but forces it).
PENALTY_MAX = 2.0
LOGIT_BIAS_MAX = 100.0
LOGIT_BIAS_MAX_TOKENS = 1024  # a row's bias is a [N] array: N a power of two ≥ the tokens given

# The batched samplers hold each row's top_k in an int32 array (a k past every vocabulary: no filter).
TOP_K_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to sample. ``temperature=0`` is greedy; ``top_k=0`` and ``top_p=1`` switch those filters off."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs; a mapping is taken too

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"SamplingParams.temperature must be a finite number ≥ 0, got {self.temperature}")
        if not 0 <= self.top_k <= TOP_K_MAX:
            raise ValueError(f"SamplingParams.top_k must be from 0 (off) to {TOP_K_MAX}, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"SamplingParams.seed must be in [0, 2**32), got {self.seed}")
        if any(not stop for stop in self.stop_strings):
            raise ValueError("SamplingParams.stop_strings must not contain an empty string")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -PENALTY_MAX <= value <= PENALTY_MAX):
                raise ValueError(f"SamplingParams.{name} must be from -{PENALTY_MAX} to {PENALTY_MAX}, got {value}")
        bias = {int(token_id): float(value) for token_id, value in
                (self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias)}
        if len(bias) > LOGIT_BIAS_MAX_TOKENS:
            raise ValueError(f"SamplingParams.logit_bias holds {len(bias)} tokens; give at most {LOGIT_BIAS_MAX_TOKENS}")
        for token_id, value in bias.items():
            if not (math.isfinite(value) and -LOGIT_BIAS_MAX <= value <= LOGIT_BIAS_MAX):
                raise ValueError(f"SamplingParams.logit_bias of token {token_id} must be from -{LOGIT_BIAS_MAX} to "
                                 f"{LOGIT_BIAS_MAX}, got {value}")
        object.__setattr__(self, "logit_bias", tuple(sorted(bias.items())))
        object.__setattr__(self, "stop_token_ids", tuple(int(token_id) for token_id in self.stop_token_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether a presence or frequency penalty applies (the decode loop then counts tokens)."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0

    @property
    def biased(self) -> bool:
        return bool(self.logit_bias)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Generation:
    """One completion. ``logprobs[i]`` is the float32 log-probability of ``token_ids[i]``."""

    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"


def bucket_length(length: int, *, minimum: int) -> int:
    """The smallest power of two ≥ ``length`` and ≥ ``minimum`` (a compile-shape bucket)."""
    return max(minimum, 1 << max(0, length - 1).bit_length())


def filter_logits(logits_bv: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Sets logits outside the top-k, then outside the top-p nucleus, to -inf (see module note).

    ``top_k``: int32 scalar, 0 = off. ``top_p``: float32 scalar, 1 = off.
    """
    vocab_size = logits_bv.shape[-1]
    sorted_bv = -jnp.sort(-logits_bv, axis=-1)  # descending
    rank_v = jnp.arange(vocab_size)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab_size), vocab_size)
    sorted_bv = jnp.where(rank_v[None, :] < k, sorted_bv, -jnp.inf)
    probs_bv = jax.nn.softmax(sorted_bv, axis=-1)
    mass_before_bv = jnp.cumsum(probs_bv, axis=-1) - probs_bv
    # Keep a token while the mass of the more likely ones is still below p; the first is always kept.
    keep_count_b = jnp.maximum(jnp.sum((mass_before_bv < top_p) & (rank_v[None, :] < k), axis=-1), 1)
    threshold_b1 = jnp.take_along_axis(sorted_bv, keep_count_b[:, None] - 1, axis=-1)
    return jnp.where(logits_bv >= threshold_b1, logits_bv, -jnp.inf)


def apply_penalties(logits_bv: jax.Array, counts_bv: jax.Array, presence_b: jax.Array,
                    frequency_b: jax.Array) -> jax.Array:
    """OpenAI's presence and frequency penalties: ``logits - presence * (count > 0) - frequency * count``.

    ``counts_bv``: how often each token was generated so far in each row. ``presence_b``, ``frequency_b``:
    float32 [B], 0 = off.
    """
    counts_bv = counts_bv.astype(logits_bv.dtype)
    return (logits_bv - presence_b[:, None] * (counts_bv > 0).astype(logits_bv.dtype)
            - frequency_b[:, None] * counts_bv)


def apply_logit_bias(logits_bv: jax.Array, bias_ids_bn: jax.Array, bias_values_bn: jax.Array) -> jax.Array:
    """Adds each row's bias to its tokens' logits. ``bias_ids_bn``: int32 [B, N] token ids, padded with ids
    past the vocabulary (dropped); ``bias_values_bn``: float32 [B, N]."""
    rows_b1 = jnp.arange(logits_bv.shape[0])[:, None]
    return logits_bv.at[rows_b1, bias_ids_bn].add(bias_values_bn.astype(logits_bv.dtype), mode="drop")


def count_tokens(counts_bv: jax.Array, token_b: jax.Array, active_b: jax.Array | None = None) -> jax.Array:
    """``counts_bv`` with one more of each row's ``token_b`` (of the rows ``active_b`` marks, if given)."""
    one_hot_bv = token_b[:, None] == jnp.arange(counts_bv.shape[-1], dtype=token_b.dtype)[None, :]
    if active_b is not None:
        one_hot_bv = one_hot_bv & active_b[:, None]
    return counts_bv + one_hot_bv.astype(counts_bv.dtype)


def logit_bias_arrays(biases: Sequence[tuple[tuple[int, float], ...]], rows: int, vocab_size: int, *,
                      width: int | None = None):
    """(int32 [rows, N] ids, float32 [rows, N] values) for ``apply_logit_bias`` from each row's
    ``SamplingParams.logit_bias`` (rows past the list: none); N is ``width``, or where None a power of two ≥ 8
    that holds the largest, so that it rarely changes (each N is a compile). A serving process gives
    ``LOGIT_BIAS_MAX_TOKENS``: one N, which its warm-up compiles."""
    width = width or bucket_length(max((len(bias) for bias in biases), default=0), minimum=8)
    ids_bn = np.full((rows, width), vocab_size, np.int32)  # past the vocabulary: dropped
    values_bn = np.zeros((rows, width), np.float32)
    for row, bias in enumerate(biases):
        for position, (token_id, value) in enumerate(bias):
            ids_bn[row, position], values_bn[row, position] = token_id, value
    return ids_bn, values_bn


def check_logit_bias(params: SamplingParams, vocab_size: int) -> None:
    """``PromptError`` naming the first ``logit_bias`` token id outside the model's vocabulary."""
    for token_id, _ in params.logit_bias:
        if not 0 <= token_id < vocab_size:
            raise PromptError(f"logit_bias: token id {token_id} is outside the model's vocabulary (ids 0 to "
                              f"{vocab_size - 1}); use ids of this model's tokenizer")


ARGMAX_BLOCK = 128


def first_max_index(values_bv: jax.Array) -> jax.Array:
    """int32 ``jnp.argmax`` over the last axis for rows without NaN; always an index in range.

    A row holding a NaN (a diverged model) gets the index of a NaN or of its largest value: which one
    depends on whether the platform's max propagates NaNs (XLA's CPU max skips them).
    XLA's CPU argmax is one reduction over (value, index) pairs that does not vectorize: over a 16k
    vocabulary it is 3-4x slower than a max and then a min over the indices that hold it (bench/RESULTS.md,
    "Greedy argmax and the inference layout"). That second pass reads the whole row again, so when the
    axis splits into blocks of ``ARGMAX_BLOCK`` the max is taken per block, and only the first block that
    holds the row's largest value is searched: one pass over the row, not two (bench/RESULTS.md,
    "Argmax and logprobs of a decode step").
    """
    size = values_bv.shape[-1]
    block = math.gcd(size, ARGMAX_BLOCK)
    if block < ARGMAX_BLOCK // 4:  # an odd vocabulary: tiny blocks would not pay for the second step
        return _first_index_of(values_bv, jnp.max(values_bv, axis=-1, keepdims=True))
    blocks_bnk = values_bv.reshape(*values_bv.shape[:-1], size // block, block)
    block_max_bn = jnp.max(blocks_bnk, axis=-1)
    largest_b1 = jnp.max(block_max_bn, axis=-1, keepdims=True)
    first_block_b = _first_index_of(block_max_bn, largest_b1)
    holding_bk = jnp.take_along_axis(blocks_bnk, first_block_b[..., None, None], axis=-2)[..., 0, :]
    return first_block_b * block + _first_index_of(holding_bk, largest_b1)


def _first_index_of(values_bv: jax.Array, largest_b1: jax.Array) -> jax.Array:
    """The first index along the last axis that holds ``largest_b1`` or a NaN.

    Where the max skipped NaNs, ``largest_b1`` is found; where it propagated one, a NaN is: either way
    some index matches, so the result is in range.
    """
    size = values_bv.shape[-1]
    holds_it_bv = (values_bv == largest_b1) | jnp.isnan(values_bv)
    return jnp.min(jnp.where(holds_it_bv, jnp.arange(size, dtype=jnp.int32), size), axis=-1)


def _sample(logits_bv, keys_b, temperature, top_k, top_p, *, greedy: bool, filtered: bool) -> jax.Array:
    if greedy:
        return first_max_index(logits_bv)
    scaled_bv = logits_bv / temperature
    if filtered:
        scaled_bv = filter_logits(scaled_bv, top_k, top_p)
    # jax.random.categorical's own Gumbel-max draw, with the faster argmax.
    noise_bv = jax.vmap(lambda key, row_v: jax.random.gumbel(key, row_v.shape, row_v.dtype))(keys_b, scaled_bv)
    return first_max_index(noise_bv + scaled_bv)


def _token_logprobs(logits_bv: jax.Array, tokens_b: jax.Array) -> jax.Array:
    # As the trainer computes them (its logit minus logsumexp): a log_softmax would write [B, V] only
    # for one value per row to be read back.
    return token_log_probs(logits_bv[:, None], tokens_b[:, None])[:, 0]


def prefill(model, input_ids_bt: jax.Array, pad_counts_b: jax.Array, *, total_length: int, cache_dtype=None):
    """Runs left-padded prompts [B, T] through ``model`` into a fresh cache of ``total_length`` slots.

    ``pad_counts_b``: padding tokens in front of each row. Returns (float32 logits [B, V] of each
    row's last prompt token, the cache with slots [0, T) written).
    """
    batch, prompt_length = input_ids_bt.shape
    slots_s = jnp.arange(total_length, dtype=jnp.int32)
    prompt_slots_t = jnp.arange(prompt_length, dtype=jnp.int32)
    # [B, T, S]: causal over slots, padding slots hidden.
    mask_bts = ((slots_s[None, None, :] >= pad_counts_b[:, None, None])
                & (slots_s[None, None, :] <= prompt_slots_t[None, :, None]))
    positions_bt = jnp.maximum(prompt_slots_t[None, :] - pad_counts_b[:, None], 0)
    cache = model.init_cache(batch_size=batch, max_length=total_length, dtype=cache_dtype)
    hidden_btd, cache = model.hidden_states(input_ids_bt, positions_bt, attention_mask_bts=mask_bts, cache=cache)
    return model.logits(hidden_btd[:, -1:])[:, 0], cache


def decode(model, token_b: jax.Array, positions_b: jax.Array, pad_counts_b: jax.Array, cache):
    """Feeds one token per row at rotary ``positions_b`` into the next cache slot.

    Returns (float32 logits [B, V] for the following token, the advanced cache).
    """
    slots_s = jnp.arange(cache.max_length, dtype=jnp.int32)
    # [B, 1, S]: the new token sees every real slot up to and including its own.
    mask_b1s = ((slots_s[None, :] >= pad_counts_b[:, None]) & (slots_s[None, :] <= cache.index))[:, None, :]
    logits_b1v, cache = model(token_b[:, None], positions_b[:, None], attention_mask_bts=mask_b1s, cache=cache)
    return logits_b1v[:, 0], cache


def stop_string_end(text: str, stop_strings: Sequence[str], *, finished: bool) -> tuple[int, bool]:
    """How much of a row's decoded ``text`` may be shown, and whether a stop string ended the row.

    A stop string found cuts the text before its first occurrence. Otherwise an unfinished row holds
    back the longest end of its text that could still grow into a stop string, so streamed text never
    shows a stop string's beginning that the next token completes."""
    found = [position for position in (text.find(stop) for stop in stop_strings) if position >= 0]
    if found:
        return min(found), True
    if finished:
        return len(text), False
    held_back = max((size for stop in stop_strings for size in range(min(len(stop) - 1, len(text)), 0, -1)
                     if text.endswith(stop[:size])), default=0)
    return len(text) - held_back, False


class _Stream:
    """Host side of one streaming/stop-string generate(): text per row, deltas, stop-string detection."""

    def __init__(self, tokenizer: Tokenizer, *, row_count: int, on_token: OnToken | None,
                 stop_strings: tuple[str, ...], max_new_tokens: int):
        self.on_token = on_token
        self.stop_strings = stop_strings
        self.max_new_tokens = max_new_tokens
        self.decoders = [IncrementalDecoder(tokenizer) for _ in range(row_count)]
        self.texts = [""] * row_count  # decoded text so far
        self.emitted = [0] * row_count  # characters of texts already passed to on_token

    def step(self, step: int, tokens: np.ndarray, active: np.ndarray, done: np.ndarray) -> np.ndarray:
        stop_now = np.zeros(tokens.shape, np.bool_)
        for row in range(len(self.decoders)):
            if not active[row]:
                continue
            decoder = self.decoders[row]
            token_id = int(tokens[row])
            finished = bool(done[row]) or step + 1 >= self.max_new_tokens
            self.texts[row] += decoder.push(token_id)
            if finished:
                self.texts[row] += decoder.flush()
            end, stop_now[row] = stop_string_end(self.texts[row], self.stop_strings, finished=finished)
            if self.on_token is not None:
                delta = self.texts[row][self.emitted[row]:max(end, self.emitted[row])]
                self.emitted[row] = max(end, self.emitted[row])
                self.on_token(row, token_id, delta)
        return stop_now


_STREAMS: dict[int, _Stream] = {}  # the streams of generate() calls in progress, by id
_STREAM_IDS = itertools.count()


def _stream_step(stream_id, step, tokens_b, active_b, done_b):
    # The io_callback target. A module-level function, so that compiled code (which is keyed on the
    # callable) is shared; the call's own state is found by the id passed in as data.
    return _STREAMS[int(stream_id)].step(int(step), np.asarray(tokens_b), np.asarray(active_b), np.asarray(done_b))


class _CompiledGenerate:
    """The jitted prefill + decode loop for one module structure (graphdef) and KV cache dtype.

    Shared by every Sampler of that structure through ``jaxengine.programs.PROGRAMS``, so that a Sampler made
    anew for each evaluation does not compile again; ``Sampler.forget_programs`` lets them go.
    """

    def __init__(self, graphdef, cache_dtype):
        self.graphdef = graphdef
        self.cache_dtype = cache_dtype
        self.trace_count = 0  # times traced; each trace is one compile
        self.function = jax.jit(self._generate, static_argnames=("total_length", "greedy", "filtered", "with_callback",
                                                                  "penalized", "biased"))

    def _generate(self, state, input_ids_bt, pad_counts_b, row_valid_b, max_new_tokens, temperature, top_k, top_p,
                  seed, stop_ids_n, stream_id, presence, frequency, bias_ids_bn, bias_values_bn, *,
                  total_length: int, greedy: bool, filtered: bool, with_callback: bool, penalized: bool,
                  biased: bool):
        self.trace_count += 1
        model = nnx.merge(self.graphdef, state)
        batch, prompt_length = input_ids_bt.shape
        generated_capacity = total_length - prompt_length
        logits_bv, cache = prefill(model, input_ids_bt, pad_counts_b, total_length=total_length,
                                   cache_dtype=self.cache_dtype)
        prompt_lengths_b = prompt_length - pad_counts_b

        base_key = jax.random.key(seed)
        row_keys_b = jax.vmap(lambda row: jax.random.fold_in(base_key, row))(jnp.arange(batch))

        def sample(logits_bv, step):
            keys_b = jax.vmap(lambda key: jax.random.fold_in(key, step))(row_keys_b)
            return _sample(logits_bv, keys_b, temperature, top_k, top_p, greedy=greedy, filtered=filtered)

        presence_b, frequency_b = jnp.full((batch,), presence), jnp.full((batch,), frequency)

        def record(carry, logits_bv, step):
            tokens_bn, logprobs_bn, lengths_b, done_b, stopped_b, counts_bv = carry
            active_b = ~done_b
            adjusted_bv = logits_bv
            if biased:
                adjusted_bv = apply_logit_bias(adjusted_bv, bias_ids_bn, bias_values_bn)
            if penalized:
                adjusted_bv = apply_penalties(adjusted_bv, counts_bv, presence_b, frequency_b)
            token_b = sample(adjusted_bv, step)
            if penalized:
                counts_bv = count_tokens(counts_bv, token_b, active_b)
            logprob_b = _token_logprobs(logits_bv, token_b)
            tokens_bn = jax.lax.dynamic_update_slice(tokens_bn, jnp.where(active_b, token_b, 0)[:, None], (0, step))
            logprobs_bn = jax.lax.dynamic_update_slice(
                logprobs_bn, jnp.where(active_b, logprob_b, 0.0)[:, None], (0, step))
            lengths_b = lengths_b + active_b.astype(jnp.int32)
            hit_stop_b = active_b & jnp.any(token_b[:, None] == stop_ids_n[None, :], axis=-1)
            if with_callback:
                string_stop_b = io_callback(
                    _stream_step, jax.ShapeDtypeStruct((batch,), jnp.bool_), stream_id, step, token_b, active_b,
                    done_b | hit_stop_b)
                hit_stop_b = hit_stop_b | (active_b & string_stop_b)
            stopped_b = stopped_b | hit_stop_b
            done_b = done_b | hit_stop_b
            return token_b, (tokens_bn, logprobs_bn, lengths_b, done_b, stopped_b, counts_bv)

        outputs = (
            jnp.zeros((batch, generated_capacity), jnp.int32),
            jnp.zeros((batch, generated_capacity), jnp.float32),
            jnp.zeros((batch,), jnp.int32),
            ~row_valid_b,
            jnp.zeros((batch,), jnp.bool_),
            jnp.zeros((batch, logits_bv.shape[-1]), jnp.int32) if penalized else None,  # [B, V] tokens generated
        )
        token_b, outputs = record(outputs, logits_bv, jnp.int32(0))

        def keep_going(loop_state):
            step, _, _, outputs = loop_state
            return (step < max_new_tokens) & ~jnp.all(outputs[3])

        # Quantized kernels (QLoRA's, a serving copy's) are rebuilt from their codes by each step, one layer
        # at a time, and dropped after it: each waits for its projection's input (``layers.Linear``), so XLA
        # cannot hoist them out of the loop (bench/RESULTS.md, "Rollouts share the trainer's weights").
        def decode_step(loop_state):
            step, token_b, cache, outputs = loop_state
            logits_bv, cache = decode(model, token_b, prompt_lengths_b + step - 1, pad_counts_b, cache)
            token_b, outputs = record(outputs, logits_bv, step)
            return step + 1, token_b, cache, outputs

        _, _, _, outputs = jax.lax.while_loop(keep_going, decode_step, (jnp.int32(1), token_b, cache, outputs))
        tokens_bn, logprobs_bn, lengths_b, _, stopped_b, _ = outputs
        return tokens_bn, logprobs_bn, lengths_b, stopped_b



def _compiled_generate(graphdef, cache_dtype) -> _CompiledGenerate:
    return PROGRAMS.get(("generate", graphdef, cache_dtype), lambda: _CompiledGenerate(graphdef, cache_dtype))


class Sampler:
    """Generates from a ``CausalLM`` (see ``jaxengine.models``) and a ``Tokenizer``.

    The model's current weights are used on every call (a trainer may keep updating them), and
    compiled code is shared by all Samplers of models with the same structure, so making a Sampler
    is cheap. Calls from several threads at once are fine.
    ``min_bucket``: smallest prompt-length and total-length bucket. ``cache_dtype``: KV cache dtype
    (default the model's compute dtype).
    """

    def __init__(self, model: nnx.Module, tokenizer: Tokenizer, *, min_bucket: int = 16, cache_dtype=None):
        self.model = model
        self.tokenizer = tokenizer
        self.min_bucket = min_bucket
        self.config = model.config
        self._cache_dtype = cache_dtype
        self._compiled: _CompiledGenerate | None = None

    @property
    def trace_count(self) -> int:
        """Compiles so far of the generation function this model's structure uses (shared by Samplers)."""
        return 0 if self._compiled is None else self._compiled.trace_count

    def forget_programs(self, *, retire: bool = True) -> None:
        """This model structure's programs are no longer in use here (``jaxengine.programs``): among the last
        retired (``retire``) or dropped, freed once no Sampler holds them (one in use asks for them again, and
        compiles them again if they were dropped)."""
        if self._compiled is not None:
            PROGRAMS.forget(self._compiled, retire=retire)

    def _current_state(self):
        # Split on every call so that weights a trainer has updated since are the ones sampled from; the
        # compiled function depends only on the module structure (it changes if e.g. adapters are added).
        graphdef, state = nnx.split(self.model)
        self._compiled = _compiled_generate(graphdef, self._cache_dtype)
        return state

    def _prompt_ids(self, prompts: Sequence[str | Sequence[int]], add_special_tokens: bool) -> list[list[int]]:
        prompt_ids = []
        for index, prompt in enumerate(prompts):
            ids = (self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens) if isinstance(prompt, str)
                   else [int(token_id) for token_id in prompt])
            if not ids:
                raise PromptError(f"prompt {index} is empty after tokenization; give at least one token")
            if max(ids) >= self.config.vocab_size or min(ids) < 0:
                raise PromptError(f"prompt {index} has token id {max(ids)} outside the model's vocabulary "
                                 f"(vocab_size={self.config.vocab_size}); is the tokenizer the model's own?")
            prompt_ids.append(ids)
        return prompt_ids

    def generate(self, prompts: Sequence[str | Sequence[int]], params: SamplingParams, *,
                 on_token: OnToken | None = None, add_special_tokens: bool = True) -> list[Generation]:
        """Completes each prompt (a string, or a list of token ids used as given).

        String prompts are encoded with ``add_special_tokens`` (BOS as the tokenizer is configured); pass
        ``False`` for text that already holds them, e.g. a rendered chat template. ``on_token(row,
        token_id, text_delta)`` is called for every generated token, in order; a row's deltas join up to
        its final ``text``.
        """
        if not prompts:
            return []
        prompt_ids = self._prompt_ids(prompts, add_special_tokens)
        longest = max(len(ids) for ids in prompt_ids)
        context = self.config.max_position_embeddings
        if longest + params.max_new_tokens > context:
            raise ContextLengthError(f"the longest prompt ({longest} tokens) plus max_new_tokens ({params.max_new_tokens}) "
                             f"exceeds the model's context length ({context}); shorten the prompt or generate less")
        batch = bucket_length(len(prompt_ids), minimum=1)
        prompt_length = bucket_length(longest, minimum=self.min_bucket)
        total_length = bucket_length(prompt_length + params.max_new_tokens, minimum=self.min_bucket)
        # Padding slots are masked out, but their ids still go through the embedding: 0 is always valid.
        input_ids_bt = np.zeros((batch, prompt_length), np.int32)
        pad_counts_b = np.full((batch,), prompt_length - 1, np.int32)  # batch-padding rows hold one pad token
        for row, ids in enumerate(prompt_ids):
            input_ids_bt[row, prompt_length - len(ids):] = ids
            pad_counts_b[row] = prompt_length - len(ids)
        row_valid_b = np.arange(batch) < len(prompt_ids)
        stop_ids = list(dict.fromkeys([*self.tokenizer.eos_ids, *params.stop_token_ids]))
        stop_ids_n = np.full(max(1, -(-len(stop_ids) // _STOP_ID_SLOTS)) * _STOP_ID_SLOTS, -1, np.int32)
        stop_ids_n[:len(stop_ids)] = stop_ids
        check_logit_bias(params, self.config.vocab_size)
        bias_ids_bn, bias_values_bn = logit_bias_arrays([params.logit_bias] * batch, batch, self.config.vocab_size)

        with_callback = on_token is not None or bool(params.stop_strings)
        stream_id = next(_STREAM_IDS) % 2**31
        _STREAMS[stream_id] = _Stream(self.tokenizer, row_count=len(prompt_ids), on_token=on_token,
                                      stop_strings=params.stop_strings, max_new_tokens=params.max_new_tokens)
        try:
            state = self._current_state()
            outputs = self._compiled.function(
                state, input_ids_bt, pad_counts_b, row_valid_b, np.int32(params.max_new_tokens),
                np.float32(params.temperature if not params.greedy else 1.0), np.int32(params.top_k),
                np.float32(params.top_p), np.uint32(params.seed), stop_ids_n, np.int32(stream_id),
                np.float32(params.presence_penalty), np.float32(params.frequency_penalty), bias_ids_bn, bias_values_bn,
                total_length=total_length, greedy=params.greedy,
                filtered=not params.greedy and (params.top_k > 0 or params.top_p < 1), with_callback=with_callback,
                penalized=params.penalized, biased=params.biased)
            tokens_bn, logprobs_bn, lengths_b, stopped_b = jax.device_get(outputs)
        finally:
            del _STREAMS[stream_id]
        return [self._generation(ids, tokens_bn[row, :lengths_b[row]], logprobs_bn[row, :lengths_b[row]],
                                 bool(stopped_b[row]), params)
                for row, ids in enumerate(prompt_ids)]

    def _generation(self, prompt_ids, token_ids, logprobs, stopped: bool, params: SamplingParams) -> Generation:
        token_ids = [int(token_id) for token_id in token_ids]
        text = self.tokenizer.decode(token_ids)
        positions = [position for position in (text.find(stop) for stop in params.stop_strings) if position >= 0]
        if positions:
            text = text[:min(positions)]
        return Generation(text=text, token_ids=token_ids, prompt_token_ids=list(prompt_ids),
                          logprobs=[float(value) for value in logprobs],
                          finish_reason="stop" if stopped or positions else "length")
