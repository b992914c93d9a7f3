"""Serving: a model cache bounded by memory, and continuous batching of concurrent requests.

Design note.

* ``ModelCache`` keeps loaded models (base models, run exports, quantized serving copies) by key and
  evicts the least recently used ones once the bytes of their weights pass a budget. A model larger
  than the whole budget is still served, alone.
* ``ContinuousBatch`` holds the requests decoding together on one model in rows ("slots") of one KV
  cache. Each ``step`` ends the rows a user stopped or whose deadline passed, prefills waiting requests
  (as one left-padded group) into free rows, then makes one device call of ``steps_per_call`` decode
  steps for every row; the host then streams each row's tokens and frees a row as soon as it ends (EOS
  / stop id, budget). A request arriving while others decode joins at the next call instead of waiting
  for the batch to end; tokens decoded past a row's end within a call are dropped. A row's tokens of one
  call are read back at one moment, so they are streamed in one callback (``on_tokens``, as is the
  prefill's first token): whatever the caller does per callback (the serve worker sends a Redis event
  and the web an SSE message) is paid per call, not per token, and delays no token.
* Overlap: a decode call is left in flight when ``step`` returns. The next ``step`` dispatches the
  following call chained on its last tokens (they stay on the device) and only then reads it back and
  streams its tokens, so the host's work per token (detokenizing, stop strings, callbacks) runs while the
  device decodes instead of between calls: 10-15 % more tokens/s on CPU at 4-16 rows, more where the
  device is faster than the host. It waits for the read-back first when that could change the next call:
  a request waiting for a free row, a warm-up row, a layout change, or every row's budget ending in the
  call in flight. A row that ends at a stop token in one call has the next call decode it in vain (its
  tokens are dropped); a stop or timeout seen between calls keeps only the tokens already streamed.
* Layout: every row writes the same slot ``index`` each step (the model's KV cache has one write index);
  row b's prompt was copied to end just before the slot where it joined, so its tokens are slots
  ``[start_b, index]``, its mask hides the rest and its rotary position is the slot minus ``start_b``
  (the sampler's left-padding scheme with a per-row start). The cache is re-laid out (rows gathered,
  slots shifted, sizes changed: ``_Compiled.relayout``) only when the rows or slots needed change:
  rows are the power of two ≥ the live requests, slots the power of two ≥ the span from the oldest
  live row's start to the end of the next call. So attention runs over the live span, not over a
  request's whole budget or the model's context, and a lone request decodes on a one-row cache.
* Devices: on CPU a decode step of a small model runs on about one core, whatever the rows (XLA's CPU
  backend does not split small matmuls), so ``BatchDecoder(devices=...)`` splits the rows over host
  devices, one per core (``serving_devices``; the serve worker's ``TEMPER_SERVE_CPU_DEVICES``): a cache of
  R rows lives on the most devices, a power of two, that leave each at least one row (``mesh_for``),
  every program runs on that mesh (the models' constraints split the rows over ``data``), and the
  weights are whole on each device (host devices share one copy). A lone conversation stays on one
  device. A re-layout that changes the device count copies the cache whole onto the new mesh first. On
  an accelerator it is the chip alone. Each device reads all the weights every step, so only a small
  model gains (``devices_for_model``): 16 rows of the 11 MB demo model decode 1.6x faster on 2 devices
  than on one, of an 80 MB model 0.67x as fast.
* Compiles: the prefill per (group, prompt length) bucket and the decode call per (rows, slots) bucket
  and sampling mode, all powers of two, so a serving process compiles a bounded set of programs,
  never one per request (``trace_count``). Decoders of one model structure share them (``_Compiled``, held in
  the process's ``programs.PROGRAMS``); the serve worker retires a structure's once the last model of it it serves
  is evicted (``forget_programs``: the 2 last retired are kept, for a user going back to a model) and drops them
  when it is deleted, as every program keeps memory maps and a process has a limited number
  (``vm.max_map_count``, where XLA's compiler segfaults; see ``jaxengine.programs``).
* Sampling: row b draws with key ``fold_in(fold_in(key(seed_b), 0), step)``, the key ``Sampler`` gives a
  lone prompt, and the same Gumbel-max draw as ``jax.random.categorical``, so a request decodes the same
  whether it is batched, joins late or runs alone. The noise of a whole call is drawn before its steps
  (``gumbel_noise``): on CPU the random generator's per-call cost dwarfs its per-row cost.
* Penalties and bias: each row's presence/frequency penalty and logit bias are data (per-row arrays, the
  bias as [B, N] ids and values), so requests with different ones decode in one call; only whether some
  row uses either switches programs, to one decode program that applies both (zeros for the rows without),
  so that the warm-up compiles one set of them, not one per combination. That program samples (a greedy row
  takes its argmax there as in a greedy one: ``_any_sampled``), and the bias table is always
  ``LOGIT_BIAS_MAX_TOKENS`` wide (a scatter of padding, dropped): a greedy conversation with a penalty, or a
  bias of more than 8 tokens (the table grew by powers of two), compiled programs on first use otherwise. A penalized call carries each row's counts of its generated tokens
  ([B, V], donated like the cache) and hands them to the call chained on it; a call that is not chained
  (rows admitted, a re-layout) counts each row's tokens on the host and uploads them, which keeps them
  out of every re-layout and insert program.
* Log probabilities: a request may ask for them (``ServeRequest.logprobs``: how many alternatives, up to
  ``LOGPROBS_MAX``); each generated token then gets its own log probability and its alternatives'
  (``TokenLogprobs``), ``log_softmax`` of the model's raw logits, before temperature, top-k/top-p, penalties
  and bias (OpenAI's and vLLM's default). The prefill and decode programs compute them only under a static
  flag that a call sets when some row asked (every row of it gets the top ``LOGPROBS_MAX``; each keeps its own
  count on the host), so a call without them runs the programs it ran before and pays nothing more. The
  warm-up compiles none of them: few conversations ask, and the first that does compiles its own (one prefill
  and one decode program per cache size it meets).
* Prompt log probabilities (``BatchDecoder.prompt_logprobs``: ``/v1/completions``' ``echo`` with ``logprobs``, as
  lm-evaluation-harness scores text): each prompt token's log probability after the tokens before it and its
  alternatives', the same raw ``log_softmax`` as a generated token's, from one full forward pass of the prompt
  (the model's training forward, right-padded to the prompt's length bucket: ``_Compiled.score``), not from the
  prefill, whose programs, and every other program a request without them runs, stay as they were. One program
  per length bucket, the warm-up's buckets compiled by it (``warmup_scores``, after the lone and grouped answers'
  programs: a conversation's come first), longer prompts' on first use; run on the asking task's thread beside
  the batch: a prompt is scored once however many answers follow it. The [T, V] log probabilities are computed
  ``SCORE_CHUNK`` positions at a time, so a long prompt of a large vocabulary holds one chunk's, not the whole.
* ``BatchDecoder`` holds a model and its settings; ``run`` decodes a list of requests arriving together.
  ``BatchingServer`` is the concurrency: callers on any thread ``submit`` a request and wait on its
  future; one loop thread adds every submitted request to its ``ContinuousBatch`` and steps it.
  ``submit_group`` queues several as one item (an API request's ``n`` answers), so they are admitted at one
  step and decode as rows of the same calls.
* Warm-up: a fresh process compiles each program the first time a conversation needs it, on CPU about a
  second each, so a first answer stalls at its prefill and at every cache size it grows into (1.0-1.5 s
  each for the demo model). ``BatchingServer.warm`` decodes ``BatchDecoder.warmup_requests`` (a lone
  answer per prompt bucket and temperature, and per bucket one at the chat's default temperature with
  penalties and a logit bias), then ``BatchDecoder.warmup_groups`` (2, 4, 8 and 16 answers
  decoded together: the row counts concurrent chats grow into, at every cache size), then scores
  ``BatchDecoder.warmup_scores``' prompts (a prompt's scoring program per bucket of those answers' prompts), one at
  a time and only while no submitted request waits or decodes; what they compile is what real requests with those
  settings call, and their results are dropped. A warm-up row is fast-forwarded: after one decode call on
  a cache layout it skips to the next layout, so the warm-up decodes a few calls per layout instead of
  whole answers.
* Moves on host devices: requests arriving a few milliseconds apart join a batch in ever new pairs of
  cache layouts, and each re-layout (rows, slots) -> (rows, slots) and each insert of a prefilled group
  into a layout is a program of its own, which no warm-up can list: compiling one on the serving loop
  (0.1-0.3 s on CPU) stalled every row, 2-4 times per burst. So on CPU a move whose program is not
  compiled yet runs in numpy instead (milliseconds for the demo model's cache), and its program compiles
  for the next time (``_Compiled.missed``) on the server's compile thread, started only while the server
  is idle, so that neither a burst nor a request arriving during the compile waits for it. A batch's
  first cache is made in numpy too (``BatchDecoder.empty_cache``): zeros on the device are a program per
  shape. On an accelerator moves compile where they are met, as before (a large cache's trip through the
  host would cost more than the compile).
* Prefill groups likewise, on every platform: admitted requests are prefilled as one group (a power of
  two of rows, at the longest prompt's bucket), a program per (rows, bucket, sampling mode); one not
  compiled yet, where each request's lone prefill is (the lone prefills of every bucket are warmed),
  prefills them one at a time, and the group's program compiles on the compile thread: on host devices
  once the server is idle, on an accelerator at once (its host has cores to spare, and steady load may
  give no idle moment).
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxengine.models.transformer import inference_layout
from jaxengine.programs import PROGRAMS
from jaxengine.prompts import vocabulary_problem
from jaxengine.sampler import (LOGIT_BIAS_MAX_TOKENS, ContextLengthError, PromptError, SamplingParams,
                              apply_logit_bias, apply_penalties, bucket_length, check_logit_bias, count_tokens, decode,
                              filter_logits, first_max_index, logit_bias_arrays, prefill, stop_string_end)
from jaxengine.sharding import constrain, constrain_kv_cache, make_mesh
from jaxengine.tokenizer import IncrementalDecoder, Tokenizer

FINISH_REASONS = ("stop", "length", "cancelled", "timeout")
# Most alternatives a request may ask for per token (``ServeRequest.logprobs``), OpenAI's ``top_logprobs`` limit;
# a call with log probabilities computes this many for every row and each row keeps what it asked for.
LOGPROBS_MAX = 20
# Positions of a prompt whose log probabilities ``_Compiled.score`` computes at once ([SCORE_CHUNK, V] float32):
# a 4,096-token prompt of a 152k vocabulary held 2.5 GB of logits and as much of log probabilities whole.
SCORE_CHUNK = 256

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeRequest:
    """One generation: prompt token ids (already rendered with the chat template), sampling settings,
    an optional ``deadline`` on ``time.monotonic()``'s clock, an optional ``time_limit`` in seconds once
    its programs are compiled, and whether to run past EOS.

    ``time_limit`` is a chat's answer time: its clock starts once the request has its first token and its
    first decode call is dispatched (both programs compiled), so that compiling the model's programs (a
    fresh serve worker's first answers: a minute and more on a loaded CPU) and waiting for a free row do
    not eat into it; ``deadline`` bounds the whole wait, those included."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    deadline: float | None = None
    time_limit: float | None = None
    ignore_eos: bool = False  # decode the whole token budget (benchmarks)
    # Log probabilities of each generated token and of its ``logprobs`` most likely alternatives (0 to
    # LOGPROBS_MAX; None: none), streamed with the tokens and in the result (``TokenLogprobs``).
    logprobs: int | None = None

    def __post_init__(self):
        if self.logprobs is not None and not 0 <= self.logprobs <= LOGPROBS_MAX:
            raise ValueError(f"ServeRequest.logprobs must be from 0 to {LOGPROBS_MAX} alternatives per token (or None "
                             f"for none), got {self.logprobs}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScoringWarmup:
    """A warm-up item that scores a prompt (``BatchDecoder.prompt_logprobs``) to compile its length bucket's
    program (``BatchDecoder.warmup_scores``); ``BatchingServer.warm`` takes it beside requests."""

    prompt_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenLogprobs:
    """A generated token's log probability and its most likely alternatives' (token id, log probability), most
    likely first: the model's own distribution, ``log_softmax`` of its logits before temperature, top-k/top-p,
    penalties and logit bias (OpenAI's and vLLM's default "raw" log probabilities), in float32."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeResult:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str  # one of FINISH_REASONS
    first_token_seconds: float | None  # from the request's arrival (add / submit) to its first token
    logprobs: list[TokenLogprobs] | None = None  # one per token id, where the request asked for them


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadedModel:
    model: Any
    tokenizer: Tokenizer
    nbytes: int
    path: Path


def weight_bytes(model: nnx.Module) -> int:
    """Bytes of every array in the model's state (weights, quantized codes and scales)."""
    return sum(int(leaf.nbytes) for leaf in jax.tree.leaves(nnx.state(model)) if hasattr(leaf, "nbytes"))


def default_compute_dtype():
    """bfloat16 on accelerators; float32 on CPU, whose bfloat16 matmuls are slower than float32 ones."""
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


def load_serving_model(path: str | Path, *, compute_dtype=None) -> LoadedModel:
    """A quantized serving copy (``jaxengine.quantize``; on CPU its kernels expanded once, see
    ``expand_serving_kernels``) or a Hugging Face model directory, ready to serve."""
    from jaxengine.tokenizer import load_tokenizer

    path = Path(path)
    model = load_serving_weights(path, compute_dtype=compute_dtype or default_compute_dtype())
    return LoadedModel(model=model, tokenizer=load_tokenizer(path), nbytes=weight_bytes(model), path=path)


def load_serving_weights(path: str | Path, *, compute_dtype) -> nnx.Module:
    """The model of a quantized serving copy or of a Hugging Face model directory, in inference layout
    (``load_serving_model`` without the tokenizer; ``jaxengine generate`` reads it first)."""
    from jaxengine.checkpoint.hf import load_hf_model
    from jaxengine.quantize import expand_serving_kernels, is_quantized_dir, load_quantized

    if is_quantized_dir(path):
        model, _, _ = load_quantized(path, compute_dtype=compute_dtype)
        if jax.default_backend() == "cpu":  # no fused dequantization there: expand the codes once
            expand_serving_kernels(model)
    else:
        model, _ = load_hf_model(path, param_dtype=compute_dtype, compute_dtype=compute_dtype)
    return inference_layout(model)  # once here, so the separate q/k/v and gate/up kernels are not kept too


def serving_devices(count: int | None = None) -> list[jax.Device]:
    """The devices a serving process splits its rows over (``BatchDecoder(devices=...)``).

    On CPU: ``count`` host devices (default: one per core this process may run on). JAX is asked for
    them before its backend starts (``jax_num_cpu_devices``); once it has started, the host devices it
    has are used, at most ``count``. On an accelerator: its first device alone (the weights would be
    copied to each chip, where host devices share one copy).
    """
    count = len(os.sched_getaffinity(0)) if count is None else count
    if count > 1:
        try:
            jax.config.update("jax_num_cpu_devices", count)
        except RuntimeError:  # the backend has started: its devices are what there is
            pass
    if jax.default_backend() != "cpu":
        return [jax.devices()[0]]
    return jax.devices("cpu")[:max(count, 1)]


# Splitting rows over host devices makes each device read all the weights every step, and pays only while a
# step cannot use the cores by itself: on a 2-core Xeon, 16 rows decoded 1.6x faster on 2 devices for an
# 11 MB model, 1.29x for 20 MB, the same for 48 MB and 0.67x as fast for 80 MB (bench/RESULTS.md).
SPLIT_MAX_WEIGHT_BYTES = 32 * 2**20


def devices_for_model(devices: Sequence[jax.Device], nbytes: int) -> list[jax.Device]:
    """The devices to split a model's rows over: all of ``devices`` for a model of at most
    ``SPLIT_MAX_WEIGHT_BYTES`` of weights, the first alone for a larger one."""
    return list(devices) if nbytes <= SPLIT_MAX_WEIGHT_BYTES else list(devices[:1])


def directory_identity(path: str | Path) -> tuple[int, int] | None:
    """What tells one directory written at ``path`` from the next: its inode and modification time (None
    while nothing is there). Exports and serving copies are written beside their place and renamed into it
    (``jaxengine.checkpoint.hf.replace_directory``), so a new one is a new directory."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns


class ModelCache:
    """Loaded models by key, least recently used evicted beyond ``budget_bytes``. Thread-safe.

    A model is loaded again when the directory at its path is no longer the one it was loaded from: a
    resumed run exports again, and a serving copy is made again, at the same path and under the same key."""

    def __init__(self, *, budget_bytes: int, loader: Callable[[Path], LoadedModel] = load_serving_model):
        self.budget_bytes = budget_bytes
        self._loader = loader
        self._models: collections.OrderedDict[str, LoadedModel] = collections.OrderedDict()
        self._identities: dict[str, tuple[int, int] | None] = {}  # key -> directory_identity when loaded
        self._lock = threading.Lock()

    @property
    def keys(self) -> list[str]:
        """Cached keys, least recently used first."""
        with self._lock:
            return list(self._models)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(loaded.nbytes for loaded in self._models.values())

    def peek(self, key: str) -> LoadedModel | None:
        """The model cached under ``key`` (None when it is not), without loading it or marking it used."""
        with self._lock:
            return self._models.get(key)

    def discard(self, key: str) -> bool:
        """Forget the model cached under ``key`` (its weights go once nothing else holds them); whether it
        was cached."""
        with self._lock:
            self._identities.pop(key, None)
            return self._models.pop(key, None) is not None

    def get(self, key: str, path: str | Path) -> LoadedModel:
        """The model cached under ``key``, loading it from ``path`` (and evicting others) when absent or
        when ``path`` holds another directory than the one it was loaded from."""
        identity = directory_identity(path)
        with self._lock:
            if key in self._models and self._identities[key] == identity:
                self._models.move_to_end(key)
                return self._models[key]
            self._models.pop(key, None)  # the weights it replaces are not kept beside it
            self._identities.pop(key, None)
            loaded = self._loader(Path(path))
            while self._models and sum(m.nbytes for m in self._models.values()) + loaded.nbytes > self.budget_bytes:
                evicted, _ = self._models.popitem(last=False)
                del self._identities[evicted]
            self._models[key] = loaded
            self._identities[key] = identity
            return loaded


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_THREEFRY_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(key1, key2, count1, count2) -> tuple[jax.Array, jax.Array]:
    """The Threefry-2x32 block cipher (20 rounds, key schedule every 4) on uint32 arrays that broadcast
    together: the hash behind ``jax.random``'s default generator, bit for bit. Written out so that XLA
    fuses it into one elementwise loop; jax lowers its own on CPU as a rolled loop that writes the whole
    state to memory at each of its five iterations, the costliest part of drawing a decode call's noise."""
    def rotate_left(x, distance):
        return (x << np.uint32(distance)) | (x >> np.uint32(32 - distance))

    schedule = (key1, key2, key1 ^ key2 ^ _THREEFRY_PARITY)
    x0, x1 = count1 + schedule[0], count2 + schedule[1]
    for block in range(5):
        for rotation in _THREEFRY_ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = rotate_left(x1, rotation) ^ x0
        x0 = x0 + schedule[(block + 1) % 3]
        x1 = x1 + schedule[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def _gumbel_from_keys(key_data_n2: jax.Array, vocab_size: int) -> jax.Array:
    """[N, V] float32: ``jax.random.gumbel(key, (V,))`` for each raw threefry key [N, 2] (jax's
    partitionable bits: counter (0, v) for entry v, the two output words xor-ed; then its uniform in
    [tiny, 1) from the top 23 bits, and -log(-log(u)))."""
    counts_v = jnp.arange(vocab_size, dtype=jnp.uint32)
    words = threefry2x32(key_data_n2[:, :1], key_data_n2[:, 1:], jnp.zeros_like(counts_v), counts_v)
    bits_nv = words[0] ^ words[1]
    floats_nv = jax.lax.bitcast_convert_type((bits_nv >> np.uint32(9)) | np.uint32(0x3F800000), jnp.float32) - 1.0
    tiny = np.float32(np.finfo(np.float32).tiny)
    uniform_nv = jnp.maximum(tiny, floats_nv * (np.float32(1.0) - tiny) + tiny)
    return -jnp.log(-jnp.log(uniform_nv))


def gumbel_noise(seed_b, first_step_b, steps: int, vocab_size: int) -> jax.Array:
    """[steps, B, V] float32: the Gumbel noise ``jax.random.categorical`` draws for row b at its steps
    ``first_step_b + 0 .. steps - 1``, with the key the sampler gives a lone prompt at that step
    (``fold_in(fold_in(key(seed), 0), step)``). Drawn for a whole decode call at once: on CPU the
    per-call cost of the generator is much larger than its per-row cost."""
    def row_key(seed, step):
        return jax.random.key_data(jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 0), step))

    offsets_k = jnp.arange(steps, dtype=jnp.int32)
    keys_kb2 = jax.vmap(lambda offset: jax.vmap(row_key)(seed_b, first_step_b + offset))(offsets_k)
    rows = seed_b.shape[0]
    return _gumbel_from_keys(keys_kb2.reshape(steps * rows, 2), vocab_size).reshape(steps, rows, vocab_size)


def _sample_rows(logits_bv, temperature_b, top_k_b, top_p_b, noise_bv, *, filtered: bool):
    """One token per row with that row's own settings (temperature 0 = greedy); with ``noise_bv`` from
    ``gumbel_noise`` (None: every row is greedy) a row draws what ``jax.random.categorical`` draws
    with that noise's key. ``filtered``: some row uses top-k or top-p (a compile-time switch: the per-row
    sort is the costliest part of a small model's step)."""
    if noise_bv is None:
        return first_max_index(logits_bv)
    sampled_b = temperature_b > 0
    scaled_bv = logits_bv / jnp.where(sampled_b, temperature_b, 1.0)[:, None]
    if filtered:
        filtered_bv = jax.vmap(lambda row_v, k, p: filter_logits(row_v[None], k, p)[0])(scaled_bv, top_k_b, top_p_b)
        # Filtering with both filters off keeps every token only up to float rounding of the cumulative mass.
        filters_on_b = (top_k_b > 0) | (top_p_b < 1)
        scaled_bv = jnp.where(filters_on_b[:, None], filtered_bv, scaled_bv)
    # One argmax over the vocabulary for greedy and sampling rows alike (a row's greedy logits, or
    # jax.random.categorical's Gumbel-max draw): the reduction is a large share of a small model's step.
    return first_max_index(jnp.where(sampled_b[:, None], noise_bv + scaled_bv, logits_bv))


def _raw_logprobs(logits_bv, token_b):
    """The log probability [B] of each row's ``token_b`` and the ``LOGPROBS_MAX`` most likely tokens' (ids and
    log probabilities [B, N], most likely first) under ``logits_bv``, the model's raw logits (before sampling
    settings, penalties and bias). Computed for every row of a call that has a row asking: each row keeps its own
    count on the host."""
    logprobs_bv = jax.nn.log_softmax(logits_bv.astype(jnp.float32), axis=-1)
    chosen_b = jnp.take_along_axis(logprobs_bv, token_b[:, None], axis=-1)[:, 0]
    top_logprobs_bn, top_ids_bn = jax.lax.top_k(logprobs_bv, min(LOGPROBS_MAX, logprobs_bv.shape[-1]))
    return chosen_b, top_ids_bn.astype(jnp.int32), top_logprobs_bn


def _rows_view(keys_or_values: jax.Array, rows: int, kv_heads: int) -> jax.Array:
    """A cache buffer ([B*K, H, S] / [B*K, S, H], leading axis dropped when B*K = 1) as [B, K, ...]."""
    return keys_or_values.reshape(rows, kv_heads, *keys_or_values.shape[-2:])


def _cache_view(rows_view: jax.Array) -> jax.Array:
    """Back to the ``kv_cache_shapes`` layout from [B, K, ...]."""
    rows, kv_heads = rows_view.shape[:2]
    flat = rows * kv_heads
    return rows_view.reshape(((flat,) if flat > 1 else ()) + rows_view.shape[2:])


def _relayout_on_host(cache, source_rows_n: np.ndarray, shift: int, *, rows: int, length: int, kv_heads: int):
    """``_Compiled.relayout`` in numpy, without a compile: the cache (its arrays read back to the host)
    laid out as ``rows`` x ``length``, row n slot s holding row ``source_rows_n[n]`` slot s + ``shift``."""
    old_rows, old_length = cache.positions.shape
    kept_n = np.flatnonzero(source_rows_n < old_rows)
    sources_n = source_rows_n[kept_n]
    first, end = max(0, -shift), min(length, old_length - shift)  # the new slots that have an old one

    def move(old, slot_axis: int):
        view = _rows_view(np.asarray(old), old_rows, kv_heads)
        shape = [rows, *view.shape[1:]]
        shape[slot_axis] = length
        moved = np.zeros(shape, view.dtype)
        if end > first:
            into, out_of = [kept_n, slice(None), slice(None), slice(None)], [sources_n, slice(None), slice(None), slice(None)]
            into[slot_axis], out_of[slot_axis] = slice(first, end), slice(first + shift, end + shift)
            moved[tuple(into)] = view[tuple(out_of)]
        return _cache_view(moved)

    positions = np.zeros((rows, length), np.int32)
    if end > first:
        positions[kept_n, first:end] = np.asarray(cache.positions)[sources_n, first + shift:end + shift]
    return cache.replace(keys=tuple(move(keys, 3) for keys in cache.keys),
                         values=tuple(move(values, 2) for values in cache.values),
                         positions=positions, index=np.int32(int(cache.index) - shift))


def _insert_on_host(cache, new_cache, rows_g: np.ndarray, index: int, *, kv_heads: int):
    """``_Compiled.insert`` in numpy, without a compile (the cache read back to the host and copied)."""
    rows = cache.positions.shape[0]
    group, new_length = new_cache.positions.shape
    kept_g = np.flatnonzero(rows_g < rows)  # the group's padding rows are dropped
    targets_g = rows_g[kept_g]
    slots = slice(index - new_length, index)

    def put(old, new, slot_axis: int):
        view = _rows_view(np.array(old), rows, kv_heads)  # a copy: written
        into = [targets_g, slice(None), slice(None), slice(None)]
        into[slot_axis] = slots
        view[tuple(into)] = _rows_view(np.asarray(new), group, kv_heads)[kept_g]
        return _cache_view(view)

    positions = np.array(cache.positions)
    positions[targets_g, slots] = np.asarray(new_cache.positions)[kept_g]
    return cache.replace(keys=tuple(put(old, new, 3) for old, new in zip(cache.keys, new_cache.keys)),
                         values=tuple(put(old, new, 2) for old, new in zip(cache.values, new_cache.values)),
                         positions=positions, index=np.asarray(cache.index))


class _Compiled:
    """The jitted programs of continuous batching for one model structure (see the module note). The
    weights go in as a flat list of arrays, so a call's dispatch neither hashes the graph nor walks the
    state's tree. ``trace_count`` counts the compiles of the three model programs (prefill, decode, and the
    prompt's scoring)."""

    def __init__(self, graphdef, treedef, cache_dtype, kv_heads: int):
        self.graphdef = graphdef
        self.treedef = treedef
        self.cache_dtype = cache_dtype
        self.kv_heads = kv_heads
        self.trace_count = 0
        self.prefill = jax.jit(self._prefill, static_argnames=("sampled", "filtered", "biased", "logprobs"))
        self.decode = jax.jit(self._decode, static_argnames=("steps", "sampled", "filtered", "adjusted", "logprobs"),
                              donate_argnames=("cache", "counts_bv"))
        self.insert = jax.jit(self._insert, donate_argnames=("cache",))
        self.relayout = jax.jit(self._relayout, static_argnames=("rows", "length"))
        self.score = jax.jit(self._score, static_argnames=("chunk",))
        # Re-layouts, inserts and prefills by the shapes, placements and modes they were run with (keys made by
        # ``ContinuousBatch``). One met before its program was compiled ran another way (a move in numpy on host
        # devices, a group's prefill one row at a time) and waits in ``missed``, with how to compile it, for
        # the server's compile thread (``compile_missed``).
        self.compiled_keys: set[tuple] = set()
        self.missed: dict[tuple, Callable[[], Any]] = {}

    def compile_missed(self) -> bool:
        """Compiles one program that a batch did without (see ``missed``); False if none is left."""
        try:
            key, compile_it = self.missed.popitem()
        except KeyError:
            return False
        compile_it()
        self.compiled_keys.add(key)
        return True

    def _model(self, leaves):
        return nnx.merge(self.graphdef, jax.tree.unflatten(self.treedef, leaves))

    def _prefill(self, leaves, input_ids_gt, pad_counts_g, sampling_g, *, sampled: bool, filtered: bool,
                 biased: bool, logprobs: bool):
        """New requests' left-padded prompts [G, T] into a cache of T slots; their first tokens [G] (nothing
        generated yet: no penalty applies), the cache and (``logprobs``; else None) their ``_raw_logprobs``."""
        self.trace_count += 1
        raw_gv, cache = prefill(self._model(leaves), input_ids_gt, pad_counts_g, total_length=input_ids_gt.shape[1],
                                cache_dtype=self.cache_dtype)
        temperature_g, top_k_g, top_p_g, seed_g, _, _, bias_ids_gn, bias_values_gn = sampling_g
        logits_gv = apply_logit_bias(raw_gv, bias_ids_gn, bias_values_gn) if biased else raw_gv
        noise_gv = (gumbel_noise(seed_g, jnp.zeros(seed_g.shape, jnp.int32), 1, logits_gv.shape[-1])[0] if sampled
                    else None)
        token_g = _sample_rows(logits_gv, temperature_g, top_k_g, top_p_g, noise_gv, filtered=filtered)
        return token_g, cache, _raw_logprobs(raw_gv, token_g) if logprobs else None

    def _decode(self, leaves, cache, counts_bv, token_b, starts_b, steps_b, sampling_b, *, steps: int, sampled: bool,
                filtered: bool, adjusted: bool, logprobs: bool):
        """``steps`` decode steps of every row, in one call: returns the tokens [steps, B], the last of them
        [B] (what a call chained on this one starts from, sliced here rather than by an eager op that
        would compile on its first use), the cache, (``adjusted``; else None) the counts [B, V] of each
        row's generated tokens but the last (``counts_bv`` comes in likewise: each step counts the token it
        is fed), and (``logprobs``; else None) each step's ``_raw_logprobs`` ([steps, B], [steps, B, N]
        twice): only a call with a row that asked computes them. ``adjusted``: some row has a penalty or a
        logit bias; both then apply to every row (zero for those without), so that one program, which the
        warm-up compiles, serves either.

        Every row writes the shared slot ``cache.index`` each step; row b's tokens live in slots
        ``[starts_b, cache.index]`` and its rotary position is the slot minus its start.
        """
        self.trace_count += 1
        model = self._model(leaves)
        temperature_b, top_k_b, top_p_b, seed_b, presence_b, frequency_b, bias_ids_bn, bias_values_bn = sampling_b
        noise_kbv = gumbel_noise(seed_b, steps_b, steps, model.config.vocab_size) if sampled else None

        def one_step(carry, noise_bv):
            token_b, cache, counts_bv = carry
            raw_bv, cache = decode(model, token_b, cache.index - starts_b, starts_b, cache)
            logits_bv = raw_bv
            if adjusted:
                logits_bv = apply_logit_bias(logits_bv, bias_ids_bn, bias_values_bn)
                counts_bv = count_tokens(counts_bv, token_b)
                logits_bv = apply_penalties(logits_bv, counts_bv, presence_b, frequency_b)
            token_b = _sample_rows(logits_bv, temperature_b, top_k_b, top_p_b, noise_bv, filtered=filtered)
            return (token_b, cache, counts_bv), (token_b, _raw_logprobs(raw_bv, token_b) if logprobs else None)

        (_, cache, counts_bv), (tokens_kb, logprobs_k) = jax.lax.scan(
            one_step, (token_b, cache, counts_bv if adjusted else None), noise_kbv, length=steps)
        if adjusted:
            counts_bv = constrain(counts_bv, ("batch", None))
        return tokens_kb, tokens_kb[-1], self._constrained(cache), counts_bv, logprobs_k

    def _score(self, leaves, input_ids_1t, length_1, *, chunk: int):
        """``_raw_logprobs`` of each position's next token ([T] chosen, [T, N] ids and log probabilities) for a
        prompt right-padded to T tokens, ``length_1`` of them real: the model's full forward pass (as training runs
        it: causal within the real tokens), its logits made ``chunk`` positions at a time (a power of two, at most
        T). Position t scores token t + 1; the last real position and the padding score padding, which the caller
        drops."""
        self.trace_count += 1
        model = self._model(leaves)
        length = input_ids_1t.shape[1]
        positions_1t = jnp.arange(length, dtype=jnp.int32)[None]
        hidden_1td, _ = model.hidden_states(input_ids_1t, positions_1t, lengths_b=length_1)
        next_t = jnp.concatenate([input_ids_1t[0, 1:], input_ids_1t[0, :1]])  # the last is padding's
        hidden_ncd = hidden_1td[0].reshape(length // chunk, chunk, -1)

        def one_chunk(chunk_inputs):
            hidden_cd, next_c = chunk_inputs
            return _raw_logprobs(model.logits(hidden_cd[None])[0], next_c)

        chosen_nc, top_ids_nck, top_logprobs_nck = jax.lax.map(
            one_chunk, (hidden_ncd, next_t.reshape(length // chunk, chunk)))
        top = top_ids_nck.shape[-1]
        return chosen_nc.reshape(length), top_ids_nck.reshape(length, top), top_logprobs_nck.reshape(length, top)

    def _insert(self, cache, new_cache, rows_g, index):
        """Copies the prefilled rows (``new_cache``, T slots) into ``cache`` rows ``rows_g``, slots
        [index - T, index); a row index past the cache's rows (a padding row of the group) is dropped."""
        rows = cache.positions.shape[0]
        group, new_length = new_cache.positions.shape
        slots_t = index - new_length + jnp.arange(new_length, dtype=jnp.int32)
        rows_g1, slots_1t = rows_g[:, None], slots_t[None, :]

        def put(old, new, slots_last: bool):
            old_view, new_view = _rows_view(old, rows, self.kv_heads), _rows_view(new, group, self.kv_heads)
            if slots_last:  # keys [B, K, H, S]: the indexed axes come first, as [G, T, K, H]
                updated = old_view.at[rows_g1, :, :, slots_1t].set(new_view.transpose(0, 3, 1, 2), mode="drop")
            else:  # values [B, K, S, H]
                updated = old_view.at[rows_g1, :, slots_1t, :].set(new_view.transpose(0, 2, 1, 3), mode="drop")
            return _cache_view(updated)

        return self._constrained(cache.replace(
            keys=tuple(put(old, new, True) for old, new in zip(cache.keys, new_cache.keys)),
            values=tuple(put(old, new, False) for old, new in zip(cache.values, new_cache.values)),
            positions=cache.positions.at[rows_g1, slots_1t].set(new_cache.positions, mode="drop")))

    def _relayout(self, cache, source_rows_n, shift, *, rows: int, length: int):
        """A cache of ``rows`` x ``length`` whose row n, slot s holds row ``source_rows_n[n]``, slot s +
        ``shift`` of ``cache`` (zeros where that is outside it)."""
        old_rows, old_length = cache.positions.shape
        slots_s = jnp.arange(length, dtype=jnp.int32) + shift
        slots_s = jnp.where(slots_s < 0, old_length, slots_s)  # take would count a negative slot from the end

        def move(old, slot_axis: int):
            view = jnp.take(_rows_view(old, old_rows, self.kv_heads), source_rows_n, axis=0, mode="fill", fill_value=0)
            return _cache_view(jnp.take(view, slots_s, axis=slot_axis, mode="fill", fill_value=0))

        return self._constrained(cache.replace(
            keys=tuple(move(keys, 3) for keys in cache.keys),
            values=tuple(move(values, 2) for values in cache.values),
            positions=jnp.take(jnp.take(cache.positions, source_rows_n, axis=0, mode="fill", fill_value=0), slots_s,
                               axis=1, mode="fill", fill_value=0),
            index=cache.index - shift))

    def _constrained(self, cache):
        """The cache with its rows split over the mesh in context (``BatchDecoder.mesh_for``; no-op without
        one), so that every program hands the next one the cache in the sharding it was compiled for."""
        rows = cache.positions.shape[0]
        place = functools.partial(constrain_kv_cache, batch=rows, kv_heads=self.kv_heads)
        # The index too: unconstrained, a program left it replicated under another sharding object than
        # ``BatchDecoder.upload`` gives it, and jit compiles a program per argument sharding.
        return cache.replace(keys=tuple(map(place, cache.keys)), values=tuple(map(place, cache.values)),
                             positions=constrain(cache.positions, ("batch", "length")), index=constrain(cache.index, ()))


def forget_programs(decoder: BatchDecoder, *, retire: bool = True) -> None:
    """Stop keeping ``decoder``'s compiled programs as in use by a model served (the serve worker, once the last model
    of its structure it serves is evicted, ``retire``, or deleted): they are kept among the last few retired
    (``programs.PROGRAMS``, ``retired_kept``) or, deleted, freed with the last decoder using them."""
    PROGRAMS.forget(decoder.compiled, retire=retire)


OnTokens = Callable[..., None]  # (request index, token ids read together, their text[, logprobs=...])
# The tokens a row takes from one read of the device (its prefill's first token, then each decode call's) and
# the text they add: read back at one moment, they are streamed in one callback. A request that asked for
# log probabilities (``ServeRequest.logprobs``) gets them too, as ``logprobs=`` (a ``TokenLogprobs`` per token):
# a caller that asks takes the keyword, and every other caller's callback stays as it was.
RowTokens = Callable[..., None]
ShouldStop = Callable[[int], bool]  # request index -> the user asked to stop it


@dataclasses.dataclass(kw_only=True)
class _Row:
    """A request in (or waiting for) a slot, and what it has generated so far."""

    request: ServeRequest
    on_tokens: RowTokens | None
    should_stop: Callable[[], bool] | None
    on_finish: Callable[[ServeResult], None]
    arrived: float
    stop_ids: frozenset[int]
    decoder: IncrementalDecoder
    text: str = ""  # decoded so far (cut before a stop string once one is found)
    emitted: int = 0  # characters of text already streamed (a possible stop string's start is held back)
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None  # one per token, where the request asked for them
    first_token: float | None = None
    # When its ``time_limit`` started: its first decode call dispatched (its programs compiled), on the batch's clock.
    limit_from: float | None = None
    start: int = 0  # first cache slot of its prompt
    fast_forward: bool = False  # a warm-up row: meets each cache layout once (ContinuousBatch._fast_forward)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Call:
    """A decode call in flight: its tokens [steps, B] and their last step [B] (on the device), their
    ``_raw_logprobs`` where a row asked (else None), and the row in each slot then."""

    tokens_kb: jax.Array
    last_b: jax.Array
    logprobs: tuple[jax.Array, jax.Array, jax.Array] | None
    rows: list[_Row | None]


class ContinuousBatch:
    """The slots of one serving loop (see the module note): ``add`` queues a request, each ``step``
    admits waiting requests into free slots and decodes ``steps_per_call`` tokens of every slot.
    Not thread-safe: one loop drives it."""

    def __init__(self, decoder: BatchDecoder, *, max_slots: int | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.decoder = decoder
        self.max_slots = decoder.max_slots if max_slots is None else max_slots
        self.clock = clock
        self.batch_sizes: list[int] = []  # requests decoding in each decode call, for tests and benchmarks
        self.layouts: list[tuple[int, int]] = []  # the cache's (rows, slots) at each decode call, likewise
        self._waiting: collections.deque[_Row] = collections.deque()
        self._rows: list[_Row | None] = []  # one per cache row
        self._cache = None
        self._index = 0  # the slot the next decode step writes, shared by every row
        self._calls_at_layout = 0  # decode calls since the cache was last laid out
        self._in_flight: _Call | None = None  # the decode call dispatched and not yet read back
        self._mesh: Mesh | None = None  # the devices the cache's rows are split over (BatchDecoder.mesh_for)
        # [rows, V] counts of each row's tokens but its last, from the last adjusted decode call (None: not
        # adjusted), for a call chained on it.
        self._counts = None
        self._compiled = decoder.compiled

    @property
    def busy(self) -> bool:
        return bool(self._waiting) or self._in_flight is not None or any(row is not None for row in self._rows)

    @property
    def trace_count(self) -> int:
        return self._compiled.trace_count

    def add(self, request: ServeRequest, *, on_finish: Callable[[ServeResult], None],
            on_tokens: RowTokens | None = None, should_stop: Callable[[], bool] | None = None,
            arrived: float | None = None, fast_forward: bool = False) -> None:
        """Queue ``request`` (checked with ``BatchDecoder.check``); ``on_finish`` gets its result, after
        ``on_tokens`` got its last tokens (``RowTokens``: once per read of the device, not per token).

        ``fast_forward``: a warm-up request, whose tokens nobody reads; see ``_fast_forward``."""
        self.decoder.check(request)
        stop_ids = set(request.params.stop_token_ids) | set(() if request.ignore_eos else self.decoder.tokenizer.eos_ids)
        self._waiting.append(_Row(request=request, on_tokens=on_tokens, should_stop=should_stop, on_finish=on_finish,
                                  arrived=self.clock() if arrived is None else arrived, stop_ids=frozenset(stop_ids),
                                  decoder=IncrementalDecoder(self.decoder.tokenizer), fast_forward=fast_forward,
                                  logprobs=None if request.logprobs is None else []))

    def step(self) -> None:
        """Ends rows stopped or past their deadline, then either dispatches the next decode call on the
        call in flight's last tokens and reads that call back meanwhile (``_overlaps``), or reads it back
        first, admits waiting requests and dispatches a call (which stays in flight)."""
        now = self.clock()
        for slot, row in enumerate(self._rows):
            if row is not None:
                reason = self._early_finish(row, now)
                if reason is not None:
                    self._finish(slot, reason)
        if self._in_flight is not None:
            previous, self._in_flight = self._in_flight, None
            if self._overlaps(previous):
                self._decode_call(previous)
                self._collect(previous)
                return
            self._collect(previous)
        self._fast_forward()
        admitted = []
        while self._waiting and self._active_count() + len(admitted) < self.max_slots:
            row = self._waiting.popleft()
            reason = self._early_finish(row, now)
            if reason is not None:
                row.on_finish(self._result(row, reason))
            else:
                admitted.append(row)
        prompt_bucket = max((bucket_length(len(row.request.prompt_ids), minimum=self.decoder.min_bucket)
                             for row in admitted), default=0)
        if admitted or self._active_count():
            self._fit(new_rows=len(admitted), prompt_bucket=prompt_bucket)
        if admitted:
            self._admit(admitted, prompt_bucket)
        if self._active_count():
            self._decode_call()
            if admitted:
                dispatched = self.clock()
                for row in admitted:
                    if row.limit_from is None:
                        row.limit_from = dispatched
        if not self.busy:
            self._cache, self._rows, self._index, self._mesh = None, [], 0, None  # idle: release the cache
            self._counts = None

    def _overlaps(self, previous: _Call) -> bool:
        """Whether the next decode call can be dispatched before ``previous`` is read back: it needs
        nothing that reading it could change. So no request waits for a free row, no row is a warm-up
        row (``_fast_forward`` moves the shared slot between calls), the rows still need the cache's
        layout, and some row still has budget left after ``previous``'s tokens (a row that ends at an EOS
        within it is not known yet: the next call decodes it in vain and its tokens are dropped)."""
        rows = [row for row in self._rows if row is not None]
        if not rows or any(row.fast_forward for row in rows):
            return False
        if self._waiting and len(rows) < self.max_slots:
            return False
        steps = len(previous.tokens_kb)
        if all(row.request.params.max_new_tokens - len(row.tokens) <= steps for row in rows):
            return False
        return self._layout_fits(rows=bucket_length(len(rows), minimum=1), prompt_bucket=0)

    def _active_count(self) -> int:
        return sum(row is not None for row in self._rows)

    def _fast_forward(self) -> None:
        """When every row is a warm-up row and one decode call has run on the cache's layout, move the
        shared slot to where the next call no longer fits, as if the calls between had been decoded
        (their tokens: 0, which the rows' ``ignore_eos`` budgets count and nobody reads). The next
        ``_fit`` then grows the cache as a long answer's would, so the warm-up still compiles every
        decode and re-layout program such an answer meets, without decoding the calls that run
        programs already compiled: most of its work on a large model (each row keeps one token to
        decode at the new layout)."""
        rows = [row for row in self._rows if row is not None]
        if not rows or self._waiting or not all(row.fast_forward for row in rows) or not self._calls_at_layout:
            return
        length = self._cache.positions.shape[1]
        skip = min(length - self.decoder.steps_per_call + 1 - self._index,
                   min(row.request.params.max_new_tokens - len(row.tokens) for row in rows) - 1)
        if skip <= 0:
            return
        self._index += skip
        # Placed as the index it replaces: an uncommitted one made every program after it another program
        # than real traffic (whose index a program left on the mesh) calls.
        index = self._cache.index
        self._cache = self._cache.replace(index=jax.device_put(np.int32(self._index),
                                                               index.sharding if index.committed else None))
        for row in rows:
            row.tokens.extend([0] * skip)

    def _fit(self, *, new_rows: int, prompt_bucket: int) -> None:
        """Re-lays the cache out when the rows about to decode need other shapes: more or fewer rows,
        room for the admitted prompts before the shared slot, room for one decode call after it."""
        steps = self.decoder.steps_per_call
        active = [slot for slot, row in enumerate(self._rows) if row is not None]
        # A batch split over devices stays split when one row is left: moved onto one device its cache is
        # pinned there, unlike a lone conversation's (and a warm-up's), so every call would be another
        # program to compile; the smallest split decodes the row as fast, beside an empty one.
        rows = bucket_length(len(active) + new_rows, minimum=1 if self._mesh is None else 2)
        if self._layout_fits(rows=rows, prompt_bucket=prompt_bucket):
            return
        lowest = self._lowest_start()
        index = max(self._index - lowest, prompt_bucket)  # slots before the oldest live row are dropped
        shift = self._index - index
        length = bucket_length(index + steps, minimum=self.decoder.min_bucket)
        mesh = self.decoder.mesh_for(rows)
        if self._cache is None:
            self._cache = self.decoder.empty_cache(rows=rows, length=length, index=index, mesh=mesh)
        else:
            source_rows_n = np.full((rows,), len(self._rows), np.int32)  # past the old rows: zeros
            source_rows_n[:len(active)] = active
            self._cache = self._relayout(source_rows_n, shift, rows=rows, length=length, mesh=mesh)
        self._mesh = mesh
        moved = [self._rows[slot] for slot in active]
        for row in moved:
            row.start -= shift
        self._rows = moved + [None] * (rows - len(moved))
        self._index = index
        self._calls_at_layout = 0

    def _relayout(self, source_rows_n: np.ndarray, shift: int, *, rows: int, length: int, mesh: Mesh | None):
        """The cache laid out anew (``_Compiled.relayout``) on ``mesh``, in numpy until its program is compiled."""
        decoder, old_mesh = self.decoder, self._mesh

        def program(cache):
            cache = cache if mesh is old_mesh else decoder.place(cache, mesh, whole=True)
            with _on(mesh):
                return self._compiled.relayout(cache, source_rows_n, np.int32(shift), rows=rows, length=length)

        key = ("relayout", self._cache.positions.shape, _placement(old_mesh), rows, length, _placement(mesh))
        if self._on_host(key, program, self._cache):
            return decoder.upload(_relayout_on_host(self._cache, source_rows_n, shift, rows=rows, length=length,
                                                    kv_heads=self._compiled.kv_heads), mesh)
        return program(self._cache)

    def _insert(self, new_cache, new_mesh: Mesh | None, rows_g: np.ndarray):
        """The cache with the prefilled ``new_cache`` (on ``new_mesh``) copied into rows ``rows_g``, ending at
        the shared slot (``_Compiled.insert``), in numpy until its program is compiled."""
        decoder, mesh, index = self.decoder, self._mesh, np.int32(self._index)

        def program(cache, new_cache):
            new_cache = new_cache if new_mesh is mesh else decoder.place(new_cache, mesh, whole=True)
            with _on(mesh):
                return self._compiled.insert(cache, new_cache, rows_g, index)

        key = ("insert", self._cache.positions.shape, _placement(mesh), new_cache.positions.shape,
               _placement(new_mesh))
        if self._on_host(key, program, self._cache, new_cache):
            return decoder.upload(_insert_on_host(self._cache, new_cache, rows_g, int(index),
                                                  kv_heads=self._compiled.kv_heads), mesh)
        return program(self._cache, new_cache)

    def _on_host(self, key: tuple, program: Callable[..., Any], *caches) -> bool:
        """Whether the re-layout or insert ``key`` names runs in numpy rather than as ``program(*caches)``: on
        host devices, while its program is not compiled. A burst of requests joining a batch meets ever new
        pairs of (rows, slots) layouts and group shapes; compiling each on the serving loop (0.1-0.3 s on CPU)
        stalled every row, where the copy costs milliseconds. Its compile waits for the server to be idle
        (``_Compiled.compile_missed``: ``program`` run on zeros shaped and placed as ``caches``)."""
        if not self.decoder.on_host or key in self._compiled.compiled_keys:
            self._compiled.compiled_keys.add(key)
            return False
        shapes = [jax.tree.map(_shape_and_placement, cache) for cache in caches]
        self._miss(key, lambda: program(*(jax.tree.map(_zeros_placed, shape) for shape in shapes)))
        return True

    def _miss(self, key: tuple, compile_it: Callable[[], Any]) -> None:
        self._compiled.missed.setdefault(key, compile_it)

    def _lowest_start(self) -> int:
        return min((row.start for row in self._rows if row is not None), default=self._index)

    def _layout_fits(self, *, rows: int, prompt_bucket: int) -> bool:
        """Whether the cache has ``rows`` rows, room for a ``prompt_bucket`` prompt before the shared slot
        and for one decode call after it, and is not over four times the live span."""
        if self._cache is None:
            return False
        steps, length = self.decoder.steps_per_call, self._cache.positions.shape[1]
        return (rows == len(self._rows) and self._index >= prompt_bucket and self._index + steps <= length
                and bucket_length(self._index - self._lowest_start() + steps, minimum=self.decoder.min_bucket) * 4
                > length)

    def _admit(self, admitted: list[_Row], prompt_bucket: int) -> None:
        """Prefills the admitted requests and copies them into free rows ending at the shared slot: as one
        group, or one at a time while the group's program is not compiled and each lone one's is (the
        server's compile thread then compiles it: see the module note)."""
        requests, compiled = [row.request for row in admitted], self._compiled.compiled_keys
        key = self._prefill_key(requests, prompt_bucket)
        lone_keys = ([] if len(admitted) == 1 or key in compiled
                     else [self._prefill_key([request], prompt_bucket) for request in requests])
        if not lone_keys or not all(lone in compiled for lone in lone_keys):
            self._prefill(admitted, prompt_bucket, key)
            return
        self._miss(key, lambda: self._prefill_program(requests, prompt_bucket))
        for row, lone in zip(admitted, lone_keys):
            self._prefill([row], prompt_bucket, lone)

    def _prefill_key(self, requests: list[ServeRequest], prompt_bucket: int) -> tuple:
        group = bucket_length(len(requests), minimum=1)
        return ("prefill", group, prompt_bucket, _any_sampled(requests), _any_filtered(requests),
                _any_biased(requests), _any_logprobs(requests), _placement(self.decoder.mesh_for(group)))

    def _prefill_program(self, requests: list[ServeRequest], prompt_bucket: int):
        """The prefill of ``requests`` as one group (padded to a power of two) at ``prompt_bucket``: their
        first tokens, their cache, their ``_raw_logprobs`` (None where none asked) and the mesh these are on."""
        group = bucket_length(len(requests), minimum=1)
        input_ids_gt = np.zeros((group, prompt_bucket), np.int32)
        pad_counts_g = np.full((group,), prompt_bucket - 1, np.int32)  # group-padding rows hold one pad token
        for position, request in enumerate(requests):
            ids = request.prompt_ids
            input_ids_gt[position, prompt_bucket - len(ids):] = ids
            pad_counts_g[position] = prompt_bucket - len(ids)
        group_mesh = self.decoder.mesh_for(group)
        with _on(group_mesh):
            token_g, new_cache, logprobs = self._compiled.prefill(
                self.decoder.leaves_on(group_mesh), input_ids_gt, pad_counts_g,
                self.decoder.sampling_arrays(requests, group), sampled=_any_sampled(requests),
                filtered=_any_filtered(requests), biased=_any_biased(requests), logprobs=_any_logprobs(requests))
        return token_g, new_cache, logprobs, group_mesh

    def _prefill(self, admitted: list[_Row], prompt_bucket: int, key: tuple) -> None:
        """Prefills the admitted requests as one group (the program ``key`` names) and copies them into free
        rows ending at the shared slot."""
        self._compiled.compiled_keys.add(key)
        token_g, new_cache, logprobs, group_mesh = self._prefill_program([row.request for row in admitted],
                                                                         prompt_bucket)
        group = token_g.shape[0]
        free = [slot for slot, row in enumerate(self._rows) if row is None]
        rows_g = np.full((group,), len(self._rows), np.int32)  # padding rows: dropped
        rows_g[:len(admitted)] = free[:len(admitted)]
        self._cache = self._insert(new_cache, group_mesh, rows_g)
        first_tokens, logprobs = jax.device_get((token_g, logprobs))
        now = self.clock()
        for position, row in enumerate(admitted):
            slot = int(rows_g[position])
            row.start = self._index - len(row.request.prompt_ids)
            self._rows[slot] = row
            row.first_token = now - row.arrived
            first = [int(first_tokens[position])]
            self._take(slot, first, _row_logprobs(logprobs, position, first, row.request.logprobs))

    def _decode_call(self, previous: _Call | None = None) -> None:
        """Dispatches one decode call of every row and leaves it in flight. Each row goes on from its last
        token: on the host, or, chained on ``previous`` (not read back yet), that call's last tokens."""
        rows, steps = len(self._rows), self.decoder.steps_per_call
        pending = 0 if previous is None else len(previous.tokens_kb)  # each row's tokens in previous
        token_b = np.zeros((rows,), np.int32)
        starts_b = np.full((rows,), self._index, np.int32)  # a free row sees only the slot it writes
        steps_b = np.zeros((rows,), np.int32)
        for slot, row in enumerate(self._rows):
            if row is not None:
                token_b[slot], starts_b[slot], steps_b[slot] = row.tokens[-1], row.start, len(row.tokens) + pending
        requests = [row.request if row is not None else None for row in self._rows]
        live = [request for request in requests if request is not None]
        self.batch_sizes.append(len(live))
        self.layouts.append(tuple(self._cache.positions.shape))
        if previous is not None:
            token_b = previous.last_b
        elif self._mesh is not None:
            # Split over the rows as a chained call's last tokens are: jit compiles a program per argument
            # sharding, so host tokens made the first call at each layout and the chained calls after it two
            # programs, and a warm-up (whose calls never chain) compiled only one of them.
            token_b = jax.device_put(token_b, NamedSharding(self._mesh, PartitionSpec("data")))
        adjusted = _any_penalized(live) or _any_biased(live)
        counts_bv = None
        if adjusted:
            # Chained: the previous call's counts (the same rows); else each row's tokens but its last, counted here.
            counts_bv = self._counts if previous is not None and self._counts is not None else self._host_counts()
        with _on(self._mesh):
            tokens_kb, last_b, self._cache, self._counts, logprobs = self._compiled.decode(
                self.decoder.leaves_on(self._mesh), self._cache, counts_bv, token_b, starts_b, steps_b,
                self.decoder.sampling_arrays(requests, rows), steps=steps, sampled=_any_sampled(live),
                filtered=_any_filtered(live), adjusted=adjusted, logprobs=_any_logprobs(live))
        self._index += steps
        self._calls_at_layout += 1
        self._in_flight = _Call(tokens_kb=tokens_kb, last_b=last_b, logprobs=logprobs, rows=list(self._rows))

    def _host_counts(self):
        """[rows, V] int32: how often each row generated each token, its last token left out (the decode call
        counts the token it is fed), placed as the cache's rows."""
        vocab_size = self.decoder.model.config.vocab_size
        counts_bv = np.zeros((len(self._rows), vocab_size), np.int32)
        for slot, row in enumerate(self._rows):
            if row is not None and len(row.tokens) > 1:
                counts_bv[slot] = np.bincount(row.tokens[:-1], minlength=vocab_size)[:vocab_size]
        if self._mesh is None:
            return jax.device_put(counts_bv)
        return jax.device_put(counts_bv, NamedSharding(self._mesh, PartitionSpec("data")))

    def _collect(self, call: _Call) -> None:
        """Reads a decode call's tokens back and takes them, for each row still in the slot it had then
        (a row that ended meanwhile, or a row admitted since into its slot, takes none of them)."""
        tokens_kb, logprobs = jax.device_get((call.tokens_kb, call.logprobs))
        if logprobs is not None:  # [steps, B, ...] -> rows first, as _row_logprobs reads them
            logprobs = tuple(np.swapaxes(array, 0, 1) for array in logprobs)
        for slot, row in enumerate(call.rows):
            if row is not None and self._rows[slot] is row:
                token_ids = np.asarray(tokens_kb)[:, slot].tolist()
                self._take(slot, token_ids, None if logprobs is None
                           else _row_logprobs(logprobs, slot, token_ids, row.request.logprobs))

    def _take(self, slot: int, token_ids: list[int], logprobs: list[TokenLogprobs] | None = None) -> None:
        """Appends the tokens read for the row in ``slot`` up to the one that ends it (if any; the rest were
        decoded in vain), with their ``logprobs`` where the row asked, streams them in one ``on_tokens`` call,
        and frees the slot when the row ended."""
        row = self._rows[slot]
        taken, reason, end = [], None, len(row.text)
        for token_id in token_ids:
            row.tokens.append(token_id)
            taken.append(token_id)
            if token_id in row.stop_ids:
                reason = "stop"
            elif len(row.tokens) >= row.request.params.max_new_tokens:
                reason = "length"
            row.text += row.decoder.push(token_id) + (row.decoder.flush() if reason else "")
            end, stopped = stop_string_end(row.text, row.request.params.stop_strings, finished=reason is not None)
            if stopped:
                reason, row.text = "stop", row.text[:end]
            if reason is not None:
                break
        delta = row.text[row.emitted:max(end, row.emitted)]
        row.emitted = max(end, row.emitted)
        taken_logprobs = None
        if row.logprobs is not None:
            taken_logprobs = logprobs[:len(taken)]
            row.logprobs.extend(taken_logprobs)
        if row.on_tokens is not None:
            row.on_tokens(taken, delta, **({} if taken_logprobs is None else {"logprobs": taken_logprobs}))
        if reason is not None:
            self._finish(slot, reason)

    def _finish(self, slot: int, reason: str) -> None:
        row = self._rows[slot]
        self._rows[slot] = None
        row.on_finish(self._result(row, reason))

    def _result(self, row: _Row, reason: str) -> ServeResult:
        # A stopped row may hold back a partial character in its decoder; the full decode has it.
        text = self.decoder.tokenizer.decode(row.tokens) if reason in ("cancelled", "timeout") else row.text
        return ServeResult(text=text, token_ids=row.tokens, prompt_tokens=len(row.request.prompt_ids),
                           finish_reason=reason, first_token_seconds=row.first_token, logprobs=row.logprobs)

    @staticmethod
    def _early_finish(row: _Row, now: float) -> str | None:
        if row.should_stop is not None and row.should_stop():
            return "cancelled"
        if row.request.deadline is not None and now >= row.request.deadline:
            return "timeout"
        limit = row.request.time_limit
        if limit is not None and row.limit_from is not None and now >= row.limit_from + limit:
            return "timeout"
        return None


def _row_logprobs(logprobs, row: int, token_ids: list[int], alternatives: int | None) -> list[TokenLogprobs] | None:
    """The ``TokenLogprobs`` of row ``row``'s ``token_ids`` from ``_raw_logprobs`` read back (numpy, rows first:
    [B, ...] for one token each, [B, steps, ...] for a call's), ``alternatives`` of them kept; None where the row
    asked for none."""
    if alternatives is None:
        return None
    chosen, top_ids, top_logprobs = (np.asarray(array)[row] for array in logprobs)
    chosen, top_ids, top_logprobs = np.atleast_1d(chosen), np.atleast_2d(top_ids), np.atleast_2d(top_logprobs)
    return [TokenLogprobs(token_id=token_id, logprob=float(chosen[step]),
                          top=tuple(zip(top_ids[step, :alternatives].tolist(),
                                        top_logprobs[step, :alternatives].tolist())))
            for step, token_id in enumerate(token_ids)]


def _placement(mesh: Mesh | None) -> tuple[int, ...] | None:
    """The devices of ``mesh`` (None: one device, uncommitted), as a program's key names them."""
    return None if mesh is None else tuple(device.id for device in mesh.devices.flat)


def _shape_and_placement(array) -> jax.ShapeDtypeStruct:
    """What a jitted program is compiled for about ``array``: shape, dtype, and where it is committed
    (None: not committed to a device, another program than the same array committed)."""
    return jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=array.sharding if array.committed else None)


def _zeros_placed(shape: jax.ShapeDtypeStruct) -> jax.Array:
    """Zeros shaped and placed as ``shape`` says, for a program to compile on (``_shape_and_placement``)."""
    return jax.device_put(np.zeros(shape.shape, shape.dtype), shape.sharding)


def _on(mesh: Mesh | None):
    """The context a program runs in for a cache split over ``mesh`` (None: one device, no mesh)."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def _any_sampled(requests) -> bool:
    """Whether a call runs a sampling program (with noise): some row samples, or some row has a penalty or a
    logit bias. A greedy row takes its argmax in either program, and the warm-up decodes penalties and bias
    at the chat's default temperature only: a greedy conversation with them compiled programs of its own."""
    return any(request.params.temperature > 0 or request.params.penalized or request.params.biased
               for request in requests if request is not None)


def _any_penalized(requests) -> bool:
    return any(request.params.penalized for request in requests if request is not None)


def _any_biased(requests) -> bool:
    return any(request.params.biased for request in requests if request is not None)


def _any_logprobs(requests) -> bool:
    """Whether a call computes log probabilities (``_raw_logprobs``): some row asked."""
    return any(request.logprobs is not None for request in requests if request is not None)


def _any_filtered(requests) -> bool:
    return any(request.params.temperature > 0 and (request.params.top_k > 0 or request.params.top_p < 1)
               for request in requests if request is not None)


class BatchDecoder:
    """Decodes ``ServeRequest`` together on one model (its weights as of construction), in up to
    ``max_slots`` slots (see the module note).
    ``steps_per_call``: decode steps per device call (stops, deadlines and new requests are looked at
    between calls). ``devices``: devices to split the rows over (see the module note); the first one holds
    the model. None: the model's device alone."""

    def __init__(self, model: nnx.Module, tokenizer: Tokenizer, *, min_bucket: int = 16, cache_dtype=None,
                 max_slots: int = 64, steps_per_call: int = 8, devices: Sequence[jax.Device] | None = None):
        if max_slots < 1 or steps_per_call < 1:
            raise ValueError(f"BatchDecoder: max_slots ({max_slots}) and steps_per_call ({steps_per_call}) "
                             "must be at least 1")
        # q/k/v and gate/up as one matmul each, on CPU an untied output projection (a copy sharing the
        # other weights; nothing new for a model that load_serving_model already laid out).
        self.model = inference_layout(model)
        self.tokenizer = tokenizer
        self.min_bucket = min_bucket
        self.cache_dtype = cache_dtype
        self.max_slots = max_slots
        self.steps_per_call = steps_per_call
        # Split once: a served model's weights do not change, and splitting a model costs milliseconds.
        graphdef, state = nnx.split(self.model)
        self.leaves, treedef = jax.tree.flatten(state)
        kv_heads = model.config.num_kv_heads
        self.compiled = PROGRAMS.get(("serving", graphdef, treedef, cache_dtype, kv_heads),
                                     lambda: _Compiled(graphdef, treedef, cache_dtype, kv_heads))
        self.devices = tuple(devices or ())
        self.on_host = all(device.platform == "cpu" for device in self.leaves[0].devices())
        self._meshes: dict[int, Mesh] = {}
        self._leaves_on: dict[int, list[jax.Array]] = {}
        self._cache_shapes: dict[tuple[int, int], Any] = {}  # (rows, length) -> init_cache's shapes

    def mesh_for(self, rows: int) -> Mesh | None:
        """The mesh a cache of ``rows`` rows (a power of two) is split over: its ``data`` axis the most
        devices, a power of two, that leave each at least one row; None where that is one device."""
        count = 1
        while count * 2 <= min(rows, len(self.devices)):
            count *= 2
        if count == 1:
            return None
        if count not in self._meshes:
            self._meshes[count] = make_mesh(data=count, devices=self.devices[:count])
        return self._meshes[count]

    def leaves_on(self, mesh: Mesh | None) -> list[jax.Array]:
        """The weights, whole on every device of ``mesh`` (CPU devices share one copy: no memory is added)."""
        if mesh is None:
            return self.leaves
        count = mesh.devices.size
        if count not in self._leaves_on:
            self._leaves_on[count] = jax.device_put(self.leaves, NamedSharding(mesh, PartitionSpec()))
        return self._leaves_on[count]

    def place(self, cache, mesh: Mesh | None, *, whole: bool = False):
        """``cache`` on the model's device (``mesh`` None), or on ``mesh`` with its rows split over ``data``
        (``whole``: a copy on every device, for a program that then lays it out anew)."""
        if mesh is None:
            return jax.device_put(cache, next(iter(self.leaves[0].devices())))
        return jax.device_put(cache, _cache_shardings(cache, mesh, whole=whole))

    def empty_cache(self, *, rows: int, length: int, index: int, mesh: Mesh | None):
        """A zero cache of ``rows`` x ``length`` writing slot ``index`` next, made on the host and uploaded:
        the model's ``init_cache`` (``jnp.zeros``) and a split of it over ``mesh`` are each a program to
        compile per shape, 0.2-0.3 s on CPU for a batch's first layout that no warm-up met. On one device it
        stays uncommitted, as the warm-up's is: a committed one is another program to compile. On an
        accelerator the zeros are made there: uploading a large cache's would cross the host link."""
        if not self.on_host:
            cache = self.model.init_cache(batch_size=rows, max_length=length, dtype=self.cache_dtype)
            cache = cache.replace(index=jnp.int32(index))
            return cache if mesh is None else self.place(cache, mesh)
        if (rows, length) not in self._cache_shapes:
            self._cache_shapes[rows, length] = jax.eval_shape(functools.partial(
                self.model.init_cache, batch_size=rows, max_length=length, dtype=self.cache_dtype))
        cache = jax.tree.map(lambda shape: np.zeros(shape.shape, shape.dtype), self._cache_shapes[rows, length])
        return self.upload(cache.replace(index=np.int32(index)), mesh)

    def upload(self, cache, mesh: Mesh | None):
        """A cache built on the host (numpy), placed as the programs leave one: its rows split over ``mesh``,
        or uncommitted on the default device without a mesh. Always a copy: the decode call donates it."""
        shardings = None if mesh is None else _cache_shardings(cache, mesh, whole=False)
        return jax.device_put(cache, shardings, may_alias=False)

    def run(self, requests: Sequence[ServeRequest], *, on_tokens: OnTokens | None = None,
            should_stop: ShouldStop | None = None, clock: Callable[[], float] = time.monotonic) -> list[ServeResult]:
        """Generate for every request (all arriving now); each ends at an EOS / stop id, its token budget,
        a stop request or its deadline, whichever comes first."""
        for request in requests:
            self.check(request)
        batch = ContinuousBatch(self, clock=clock)
        results: list[ServeResult | None] = [None] * len(requests)
        for index, request in enumerate(requests):
            batch.add(request, on_finish=functools.partial(results.__setitem__, index),
                      on_tokens=None if on_tokens is None else functools.partial(on_tokens, index),
                      should_stop=None if should_stop is None else functools.partial(should_stop, index))
        while batch.busy:
            batch.step()
        return results

    def check(self, request: ServeRequest) -> None:
        """Raise ``PromptError`` for a request this model cannot take."""
        self.check_prompt(request.prompt_ids, new_tokens=request.params.max_new_tokens)
        check_logit_bias(request.params, self.model.config.vocab_size)

    def check_prompt(self, prompt_ids: Sequence[int], *, new_tokens: int) -> None:
        """Raise ``PromptError`` for a prompt this model cannot take with ``new_tokens`` after it (0: a prompt
        only scored, ``prompt_logprobs``)."""
        config = self.model.config
        if not prompt_ids:
            raise PromptError("the prompt is empty; give at least one token")
        if problem := vocabulary_problem(prompt_ids, vocab_size=config.vocab_size):
            raise PromptError(problem)
        if len(prompt_ids) + new_tokens > config.max_position_embeddings:
            if not new_tokens:
                raise ContextLengthError(f"the prompt ({len(prompt_ids)} tokens) exceeds the model's context length "
                                         f"({config.max_position_embeddings}); shorten the prompt")
            raise ContextLengthError(f"the prompt ({len(prompt_ids)} tokens) plus the tokens to generate "
                                     f"({new_tokens}) exceeds the model's context length "
                                     f"({config.max_position_embeddings}); shorten the prompt or ask for fewer tokens")

    def prompt_logprobs(self, prompt_ids: Sequence[int], *, alternatives: int) -> list[TokenLogprobs]:
        """The log probability of each prompt token but the first (nothing comes before it to predict it) after the
        tokens before it, and its ``alternatives`` most likely alternatives' (0 to ``LOGPROBS_MAX``): the same raw
        ``log_softmax`` as a generated token's (``TokenLogprobs``), from one full forward pass of the prompt at its
        length bucket (``_Compiled.score``: one program per bucket, whatever the prompt). ``PromptError`` for a
        prompt the model cannot take (``check_prompt``). Thread-safe: the serve task's thread calls it beside the
        batching server's loop."""
        if not 0 <= alternatives <= LOGPROBS_MAX:
            raise ValueError(f"prompt_logprobs: alternatives must be from 0 to {LOGPROBS_MAX}, got {alternatives}")
        self.check_prompt(prompt_ids, new_tokens=0)
        length = bucket_length(len(prompt_ids), minimum=self.min_bucket)
        input_ids_1t = np.zeros((1, length), np.int32)
        input_ids_1t[0, :len(prompt_ids)] = prompt_ids
        length_1 = np.asarray([len(prompt_ids)], np.int32)
        chunk = min(length, SCORE_CHUNK)  # both powers of two: the chunks tile the bucket
        logprobs = jax.device_get(self.compiled.score(self.leaves, input_ids_1t, length_1, chunk=chunk))
        scored = list(prompt_ids[1:])  # position t scores token t + 1
        return _row_logprobs(tuple(array[None, :len(scored)] for array in logprobs), 0, scored, alternatives)

    def warmup_requests(self, *, longest_prompt: int = 256, max_new_tokens: int = 256,
                        temperatures: Sequence[float] = (0.7, 0.0),
                        adjusted_temperatures: Sequence[float] = (0.7,)) -> list[ServeRequest]:
        """Requests that compile the programs a lone conversation meets (see the module note): for each
        temperature in turn (the chat's default first, then greedy; neither top-k nor top-p) and each
        prompt bucket up to ``longest_prompt`` tokens, an answer to the bucket's shortest prompt, long
        enough to reach the cache size its longest prompt reaches with ``max_new_tokens`` (within the
        model's context). It compiles the bucket's prefill and every decode call and cache re-layout it
        grows or shifts into; its row starts ahead of its prompt as far as the bucket allows, so the
        cache is shifted as well as grown. Then the same for each of ``adjusted_temperatures`` with a
        presence and frequency penalty and a logit bias: the prefill with a bias and the decode calls with
        both (``_Compiled._decode``'s ``adjusted``), which a conversation with a penalty or a logit bias
        calls, greedy or not (see the module note). Concurrent requests compile larger row counts when they come."""
        context = self.model.config.max_position_embeddings
        adjustments = {"presence_penalty": 0.5, "frequency_penalty": 0.5, "logit_bias": ((0, 1.0),)}
        requests = []
        for temperature, adjusted in [*((temperature, False) for temperature in temperatures),
                                      *((temperature, True) for temperature in adjusted_temperatures)]:
            for bucket in self._warmup_buckets(longest_prompt):
                prompt = bucket // 2 + 1
                answer = min(max_new_tokens + bucket - prompt, context - prompt)
                params = SamplingParams(max_new_tokens=answer, temperature=temperature,
                                        **(adjustments if adjusted else {}))
                requests.append(ServeRequest(prompt_ids=(0,) * prompt, ignore_eos=True, params=params))
        return requests

    def warmup_scores(self, *, longest_prompt: int = 256) -> list[ScoringWarmup]:
        """Prompts whose scoring (``prompt_logprobs``: an echo with log probabilities, as lm-evaluation-harness scores
        text) compiles the program of each prompt bucket ``warmup_requests`` prefills, the bucket's shortest prompt
        each: a bucket's program serves every prompt of it. Buckets past them (longer prompts) compile on first
        use, as their prefills do."""
        return [ScoringWarmup(prompt_ids=(0,) * (bucket // 2 + 1)) for bucket in self._warmup_buckets(longest_prompt)]

    def _warmup_buckets(self, longest_prompt: int) -> list[int]:
        """The prompt length buckets the warm-up compiles: from ``min_bucket`` up to the one holding
        ``longest_prompt`` tokens, each holding a prompt (its shortest, half the bucket and one) that leaves room in
        the model's context for a token."""
        context = self.model.config.max_position_embeddings
        buckets, bucket = [], self.min_bucket
        while bucket // 2 < min(longest_prompt, context - 1):
            buckets.append(bucket)
            bucket *= 2
        return buckets

    def warmup(self) -> list[ServeRequest | tuple[ServeRequest, ...] | ScoringWarmup]:
        """The serve worker's whole warm-up, for ``BatchingServer.warm``: ``warmup_requests``, ``warmup_groups`` and
        ``warmup_scores``, in that order and at their defaults. One list, so that what measures a warmed server
        (bench/serve_staggered.py) warms it as ``worker.tasks.serve.server_for`` does: a copy of it there lacked the
        scorings added since."""
        return [*self.warmup_requests(), *self.warmup_groups(), *self.warmup_scores()]

    def warmup_groups(self, *, row_counts: Sequence[int] = (2, 4, 8, 16), max_new_tokens: int = 256,
                      temperature: float = 0.7) -> list[tuple[ServeRequest, ...]]:
        """Groups of requests decoded together that compile what concurrent conversations meet (see the
        module note): for each row count (capped at ``max_slots``), that many answers at the chat's default
        temperature to the smallest bucket's shortest prompt, admitted at once, growing the cache through
        every size a lone answer of ``max_new_tokens`` reaches: the group's prefill, and its decode call and
        re-layout at each size. Without them, the first time a row count meets a cache size its compile
        (about a second on CPU for the demo model) stalled every conversation in the batch."""
        [lone] = self.warmup_requests(longest_prompt=self.min_bucket // 2 + 1, max_new_tokens=max_new_tokens,
                                      temperatures=(temperature,), adjusted_temperatures=())
        counts = sorted({min(count, self.max_slots) for count in row_counts} - {1})
        return [(lone,) * count for count in counts]

    def sampling_arrays(self, requests: Sequence[ServeRequest | None], rows: int):
        """Per-row (temperature, top_k, top_p, seed, presence penalty, frequency penalty, logit bias ids [B, N],
        their biases [B, N]); rows without a request (None, or past the list) are greedy, unpenalized, unbiased."""
        presence_b = np.zeros((rows,), np.float32)
        frequency_b = np.zeros((rows,), np.float32)
        for row, request in enumerate(requests):
            if request is not None:
                presence_b[row], frequency_b[row] = request.params.presence_penalty, request.params.frequency_penalty
        bias_ids_bn, bias_values_bn = logit_bias_arrays(
            [() if request is None else request.params.logit_bias for request in requests], rows,
            self.model.config.vocab_size, width=LOGIT_BIAS_MAX_TOKENS)
        temperature_b = np.zeros((rows,), np.float32)
        top_k_b = np.zeros((rows,), np.int32)
        top_p_b = np.ones((rows,), np.float32)
        seed_b = np.zeros((rows,), np.uint32)
        for row, request in enumerate(requests):
            if request is not None:
                temperature_b[row] = request.params.temperature
                top_k_b[row] = request.params.top_k
                top_p_b[row] = request.params.top_p
                seed_b[row] = request.params.seed
        return temperature_b, top_k_b, top_p_b, seed_b, presence_b, frequency_b, bias_ids_bn, bias_values_bn


def _cache_shardings(cache, mesh: Mesh, *, whole: bool):
    """Per array of ``cache``: its rows split over ``mesh``'s ``data`` axis, or (``whole``, or no rows to
    split) a copy on every device."""
    count = mesh.devices.size

    def sharding(array):
        split = not whole and np.ndim(array) >= 2 and np.shape(array)[0] % count == 0
        return NamedSharding(mesh, PartitionSpec("data") if split else PartitionSpec())

    return jax.tree.map(sharding, cache)


@dataclasses.dataclass(kw_only=True, eq=False)
class _Pending:
    request: ServeRequest
    on_tokens: RowTokens | None
    should_stop: Callable[[], bool] | None
    future: concurrent.futures.Future
    submitted: float


_WAKE = object()  # queued when an idle compile ends, so that an idle loop may start the next
# On host devices a program a batch did without compiles while the server is idle; under load that never lets
# up it would never compile, and every batch would go on moving its cache in numpy and prefilling one request
# at a time. After this long busy without a break, one compiles anyway (a core for 0.1-1 s, once a program).
BUSY_COMPILE_AFTER_S = 30.0


@dataclasses.dataclass(frozen=True)
class _Group:
    items: tuple[_Pending, ...]  # added to the batch together (BatchingServer.submit_group)


@dataclasses.dataclass(frozen=True)
class _Warmup:
    groups: tuple[tuple[ServeRequest, ...] | ScoringWarmup, ...]  # each decoded as one batch, or scored


class BatchingServer:
    """Continuous batching of the requests that callers on many threads submit for one model (see the
    module note). ``max_batch``: most requests decoding at once (default the decoder's ``max_slots``)."""

    def __init__(self, decoder: BatchDecoder, *, max_batch: int | None = None,
                 busy_compile_after_s: float = BUSY_COMPILE_AFTER_S):
        self.decoder = decoder
        self.max_batch = decoder.max_slots if max_batch is None else max_batch
        self.busy_compile_after_s = busy_compile_after_s
        self._busy_since: float | None = None  # when the batch last went from idle to decoding
        self.batch_sizes: list[int] = []  # requests decoding together in each decode call, for tests and benchmarks
        self._pending: queue.Queue[_Pending | _Group | _Warmup | object | None] = queue.Queue()
        self._in_flight: set[_Pending] = set()  # added to the batch, result not yet set
        self._batch = self._new_batch()
        # Warm-up requests not yet decoded, and the batch that decodes them (apart from the served one,
        # so that they never share a decode call with a real request).
        self._warmups: collections.deque[tuple[ServeRequest, ...]] = collections.deque()
        self._warm_batch = self._new_warm_batch()
        # Set while no warm-up given to ``warm`` is left to decode, nor a program a batch did without to compile.
        self.warmed = threading.Event()
        self.warmed.set()
        self._warmups_queued = 0  # ``warm`` calls the loop has not taken yet
        self._state_lock = threading.Lock()  # guards the counts above and ``_compiles_running``
        # Programs a batch did without compile here, one at a time, so that a request arriving meanwhile is
        # not held up by one (0.1-0.5 s on CPU); on host devices started only while the server is idle, as
        # the compile would take a core from the decoding rows.
        self._compiler = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="serving-compile")
        self._compiles_running = 0
        self._thread = threading.Thread(target=self._loop, name="batching-server", daemon=True)
        self._thread.start()

    def submit(self, request: ServeRequest, *, on_tokens: RowTokens | None = None,
               should_stop: Callable[[], bool] | None = None) -> concurrent.futures.Future:
        """Queue a request (``PromptError`` at once if the model cannot take it); it joins the running
        batch at the next decode call. The future resolves to its ``ServeResult`` (or the batch's
        exception). ``on_tokens(token_ids, delta)`` (once per read of the device: the first token, then each
        decode call's) and ``should_stop()`` run on the server's thread."""
        self.decoder.check(request)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._pending.put(_Pending(request=request, on_tokens=on_tokens, should_stop=should_stop, future=future,
                                   submitted=time.monotonic()))
        return future

    def submit_group(self, requests: Sequence[ServeRequest], *, on_tokens: OnTokens | None = None,
                     should_stop: Callable[[], bool] | None = None) -> list[concurrent.futures.Future]:
        """Queue requests to decode together (the ``n`` answers of one API request): one item of the loop's queue,
        so the loop adds them to the batch in one go and the next step admits them together, one prefill group and
        then rows of the same decode calls, where ``submit`` after ``submit`` could be taken apart by a step between
        them. (With fewer rows free than requests, the rest join as rows free up, as any waiting request.) Each
        checked as ``submit`` checks it, before any is queued; their futures, in order. ``on_tokens(index,
        token_ids, delta)`` names the request by its place; ``should_stop()`` is the whole group's."""
        for request in requests:
            self.decoder.check(request)
        submitted = time.monotonic()
        items = tuple(_Pending(request=request, future=concurrent.futures.Future(), submitted=submitted,
                               on_tokens=None if on_tokens is None else functools.partial(on_tokens, index),
                               should_stop=should_stop)
                      for index, request in enumerate(requests))
        self._pending.put(_Group(items))
        return [item.future for item in items]

    def warm(self, requests: Sequence[ServeRequest | tuple[ServeRequest, ...] | ScoringWarmup]) -> None:
        """Decode ``requests`` one after another while nothing submitted waits or decodes, to compile their
        programs before the conversations that need them (see the module note); their results are dropped.
        A tuple of requests (``BatchDecoder.warmup_groups``) decodes as one batch of that many rows; a
        ``ScoringWarmup`` (``BatchDecoder.warmup_scores``) scores its prompt. A request submitted meanwhile waits
        at most for the warm-up call under way (one compile)."""
        groups = [item if isinstance(item, (tuple, ScoringWarmup)) else (item,) for item in requests]
        for group in groups:
            if isinstance(group, ScoringWarmup):
                self.decoder.check_prompt(group.prompt_ids, new_tokens=0)
                continue
            for request in group:
                self.decoder.check(request)
        with self._state_lock:
            self._warmups_queued += 1
            self.warmed.clear()
        self._pending.put(_Warmup(tuple(groups)))

    def close(self, *, wait: bool = True) -> None:
        """Stop the loop thread once the requests already submitted are done (``wait``: until then);
        a warm-up not yet done is dropped."""
        self._pending.put(None)
        if wait:
            self._thread.join()

    def _new_batch(self) -> ContinuousBatch:
        batch = ContinuousBatch(self.decoder, max_slots=self.max_batch)
        batch.batch_sizes = self.batch_sizes  # one record across the batches a failure replaces
        return batch

    def _loop(self) -> None:
        closing = False
        while not closing or self._batch.busy:
            try:
                while not closing:  # take everything submitted; wait for a request only when idle
                    item = self._pending.get(block=not (self._batch.busy or self._warming or self._may_compile))
                    if item is None:
                        closing = True
                    elif item is _WAKE:
                        pass
                    elif isinstance(item, _Warmup):
                        self._warmups.extend(item.groups)
                        with self._state_lock:
                            self._warmups_queued -= 1
                    elif isinstance(item, _Group):
                        for pending in item.items:
                            self._add(pending)
                    else:
                        self._add(item)
            except queue.Empty:
                pass
            try:
                if self._batch.busy:
                    if self._busy_since is None:
                        self._busy_since = time.monotonic()
                    self._batch.step()
                    # An accelerator's host has cores to spare while the device decodes: a busy server need
                    # not wait for an idle moment (which may not come under steady load) to compile. On host
                    # devices it waits, but not for ever (BUSY_COMPILE_AFTER_S).
                    long_busy = time.monotonic() - self._busy_since >= self.busy_compile_after_s
                    if (not self.decoder.on_host or long_busy) and self._may_compile and not closing:
                        self._start_compile()
                elif self._warming and not closing:
                    self._busy_since = None
                    self._warm_step()
                elif self._may_compile and not closing:
                    self._busy_since = None
                    self._start_compile()
                else:
                    self._busy_since = None
            except Exception as error:  # the callers report it; the loop keeps serving
                for item in self._in_flight:
                    item.future.set_exception(error)
                self._in_flight.clear()
                self._batch = self._new_batch()
        self._compiler.shutdown(wait=False, cancel_futures=True)
        self.warmed.set()  # closed: no warm-up will run

    @property
    def compiling(self) -> bool:
        """Whether a program a batch did without is still to compile, or compiling, on the compile thread (it
        starts once the server is idle): until then the process holds fewer programs than it will."""
        with self._state_lock:
            return self._missed or self._compiles_running > 0

    @property
    def _warming(self) -> bool:
        return bool(self._warmups) or self._warm_batch.busy

    @property
    def _missed(self) -> bool:
        return bool(self.decoder.compiled.missed)

    @property
    def _may_compile(self) -> bool:
        return self._missed and not self._compiles_running

    def _start_compile(self) -> None:
        """While idle, compile one program that a batch did without (``_Compiled.missed``) on the compile
        thread; its end wakes the loop for the next."""
        with self._state_lock:
            self._compiles_running += 1
        self._compiler.submit(self._compile_missed).add_done_callback(lambda _: self._pending.put(_WAKE))

    def _compile_missed(self) -> None:
        try:
            self.decoder.compiled.compile_missed()
        except Exception:  # dropped: the batch's other way still works
            logger.exception("compiling a serving program met in a batch failed; the batch goes on without it")
        finally:
            with self._state_lock:
                self._compiles_running -= 1
            self._set_warmed_when_done()

    def _new_warm_batch(self, rows: int = 1) -> ContinuousBatch:
        return ContinuousBatch(self.decoder, max_slots=rows)  # the rows of one warm-up group, as they compile

    def _warm_step(self) -> None:
        """One step of the warm-up batch, which takes its next group only when idle (its requests admitted
        together, as that many conversations decode), or, where the next item is a ``ScoringWarmup``, its prompt
        scored. A failing warm-up is dropped: real requests report their own."""
        try:
            group = None if self._warm_batch.busy else self._warmups.popleft()
            if isinstance(group, ScoringWarmup):  # one call, as long as a warm-up decode call
                self.decoder.prompt_logprobs(group.prompt_ids, alternatives=0)
            else:
                if group is not None:
                    self._warm_batch = self._new_warm_batch(len(group))
                    for request in group:
                        self._warm_batch.add(request, on_finish=lambda result: None, fast_forward=True)
                self._warm_batch.step()
        except Exception:
            logger.exception("serving warm-up failed; the programs it did not compile compile on first use")
            self._warmups.clear()
            self._warm_batch = self._new_warm_batch()
        self._set_warmed_when_done()

    def _set_warmed_when_done(self) -> None:
        with self._state_lock:
            if not self._warming and not self._warmups_queued and not self._missed and not self._compiles_running:
                self.warmed.set()

    def _add(self, item: _Pending) -> None:
        def on_finish(result: ServeResult) -> None:
            self._in_flight.discard(item)
            item.future.set_result(result)

        self._in_flight.add(item)
        self._batch.add(item.request, on_finish=on_finish, on_tokens=item.on_tokens, should_stop=item.should_stop,
                        arrived=item.submitted)
