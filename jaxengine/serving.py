"""Serving: a model cache bounded by memory, and batched decoding of concurrent requests.

Design note.

* ``ModelCache`` keeps loaded models (base models, run exports, quantized serving copies) by key and
  evicts the least recently used ones once the bytes of their weights pass a budget. A model larger
  than the whole budget is still served, alone.
* ``BatchDecoder.run`` decodes several requests in the same steps: one prefill over the left-padded
  prompts [B, T], then one jitted decode step per token for the whole batch, driven from the host.
  Unlike ``Sampler.generate`` (one device call per generate, one set of sampling settings), the host
  loop lets every row have its own temperature / top-k / top-p / seed / token budget, and lets a row
  end at any step for reasons only the host knows: a user's stop button, a deadline. Row b draws
  with key ``fold_in(fold_in(key(seed_b), 0), step)``, the key ``Sampler`` gives a lone prompt, so a
  request decodes the same whether it is batched or alone.
* ``BatchingServer`` is the concurrency: callers on any thread ``submit`` a request and wait on its
  future; one loop thread takes every request pending at that moment (up to ``max_batch``) and runs
  them as one batch. Requests arriving meanwhile wait for the next batch (static batching: a batch
  ends when its last row does).
* Shapes are bucketed as in the sampler (powers of two) so that a serving process compiles a handful
  of programs, not one per request.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
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

from jaxengine.sampler import PromptError, SamplingParams, bucket_length, decode, filter_logits, prefill
from jaxengine.tokenizer import IncrementalDecoder, Tokenizer

FINISH_REASONS = ("stop", "length", "cancelled", "timeout")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeRequest:
    """One generation: prompt token ids (already rendered with the chat template), sampling settings,
    an optional ``deadline`` on ``time.monotonic()``'s clock, and whether to run past EOS."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    deadline: float | None = None
    ignore_eos: bool = False  # decode the whole token budget (benchmarks)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeResult:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str  # one of FINISH_REASONS
    first_token_seconds: float | None  # from the start of the batch to this row's first token


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
    """A quantized serving copy (``jaxengine.quantize``) or a Hugging Face model directory, ready to serve."""
    from jaxengine.checkpoint.hf import load_hf_model
    from jaxengine.quantize import is_quantized_dir, load_quantized
    from jaxengine.tokenizer import load_tokenizer

    path = Path(path)
    compute_dtype = compute_dtype or default_compute_dtype()
    if is_quantized_dir(path):
        model, _, _ = load_quantized(path, compute_dtype=compute_dtype)
    else:
        model, _ = load_hf_model(path, param_dtype=compute_dtype, compute_dtype=compute_dtype)
    return LoadedModel(model=model, tokenizer=load_tokenizer(path), nbytes=weight_bytes(model), path=path)


class ModelCache:
    """Loaded models by key, least recently used evicted beyond ``budget_bytes``. Thread-safe."""

    def __init__(self, *, budget_bytes: int, loader: Callable[[Path], LoadedModel] = load_serving_model):
        self.budget_bytes = budget_bytes
        self._loader = loader
        self._models: collections.OrderedDict[str, LoadedModel] = collections.OrderedDict()
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

    def get(self, key: str, path: str | Path) -> LoadedModel:
        """The model cached under ``key``, loading it from ``path`` (and evicting others) when absent."""
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            loaded = self._loader(Path(path))
            while self._models and sum(m.nbytes for m in self._models.values()) + loaded.nbytes > self.budget_bytes:
                self._models.popitem(last=False)
            self._models[key] = loaded
            return loaded


def _sample_rows(logits_bv, temperature_b, top_k_b, top_p_b, seed_b, step, *, filtered: bool):
    """One token per row with that row's own settings (temperature 0 = greedy). ``filtered``: some row
    uses top-k or top-p (a compile-time switch: the per-row sort is the costliest part of a small model's step)."""
    greedy_b = jnp.argmax(logits_bv, axis=-1)
    scaled_bv = logits_bv / jnp.where(temperature_b > 0, temperature_b, 1.0)[:, None]
    if filtered:
        filtered_bv = jax.vmap(lambda row_v, k, p: filter_logits(row_v[None], k, p)[0])(scaled_bv, top_k_b, top_p_b)
        # Filtering with both filters off keeps every token only up to float rounding of the cumulative mass.
        filters_on_b = (top_k_b > 0) | (top_p_b < 1)
        scaled_bv = jnp.where(filters_on_b[:, None], filtered_bv, scaled_bv)
    keys_b = jax.vmap(lambda seed: jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 0), step))(seed_b)
    sampled_b = jax.vmap(jax.random.categorical)(keys_b, scaled_bv)
    return jnp.where(temperature_b > 0, sampled_b, greedy_b).astype(jnp.int32)


class _Compiled:
    """The jitted prefill and decode step for one model structure. The weights go in as a flat list of
    arrays, so a decode step's dispatch neither hashes the graph nor walks the state's tree."""

    def __init__(self, graphdef, treedef, cache_dtype):
        self.graphdef = graphdef
        self.treedef = treedef
        self.cache_dtype = cache_dtype
        self.prefill = jax.jit(self._prefill, static_argnames=("total_length", "filtered"))
        self.decode = jax.jit(self._decode, static_argnames=("filtered",), donate_argnames=("cache",))

    def _model(self, leaves):
        return nnx.merge(self.graphdef, jax.tree.unflatten(self.treedef, leaves))

    def _prefill(self, leaves, input_ids_bt, pad_counts_b, sampling, *, total_length: int, filtered: bool):
        logits_bv, cache = prefill(self._model(leaves), input_ids_bt, pad_counts_b, total_length=total_length,
                                   cache_dtype=self.cache_dtype)
        return _sample_rows(logits_bv, *sampling, jnp.int32(0), filtered=filtered), cache

    def _decode(self, leaves, token_b, positions_b, pad_counts_b, cache, sampling, step, *, filtered: bool):
        logits_bv, cache = decode(self._model(leaves), token_b, positions_b, pad_counts_b, cache)
        return _sample_rows(logits_bv, *sampling, step, filtered=filtered), cache


@functools.lru_cache(maxsize=16)
def _compiled(graphdef, treedef, cache_dtype) -> _Compiled:
    return _Compiled(graphdef, treedef, cache_dtype)


OnToken = Callable[[int, int, str], None]  # (request index, token id, text delta)
ShouldStop = Callable[[int], bool]  # request index -> the user asked to stop it


class BatchDecoder:
    """Decodes a batch of ``ServeRequest`` together on one model (see the module note)."""

    def __init__(self, model: nnx.Module, tokenizer: Tokenizer, *, min_bucket: int = 16, cache_dtype=None):
        self.model = model
        self.tokenizer = tokenizer
        self.min_bucket = min_bucket
        self.cache_dtype = cache_dtype

    def run(self, requests: Sequence[ServeRequest], *, on_token: OnToken | None = None,
            should_stop: ShouldStop | None = None, clock: Callable[[], float] = time.monotonic) -> list[ServeResult]:
        """Generate for every request; each ends at an EOS / stop id, its token budget, a stop request
        or its deadline, whichever comes first."""
        if not requests:
            return []
        for request in requests:
            self.check(request)
        started = clock()
        count = len(requests)
        batch = bucket_length(count, minimum=1)
        prompt_length = bucket_length(max(len(r.prompt_ids) for r in requests), minimum=self.min_bucket)
        budget = max(r.params.max_new_tokens for r in requests)
        total_length = bucket_length(prompt_length + budget, minimum=self.min_bucket)
        input_ids_bt = np.zeros((batch, prompt_length), np.int32)
        pad_counts_b = np.full((batch,), prompt_length - 1, np.int32)  # batch-padding rows hold one pad token
        for row, request in enumerate(requests):
            input_ids_bt[row, prompt_length - len(request.prompt_ids):] = request.prompt_ids
            pad_counts_b[row] = prompt_length - len(request.prompt_ids)
        sampling = self._sampling_arrays(requests, batch)
        stop_ids = [set(r.params.stop_token_ids) | set(() if r.ignore_eos else self.tokenizer.eos_ids)
                    for r in requests]

        graphdef, state = nnx.split(self.model)
        leaves, treedef = jax.tree.flatten(state)
        compiled = _compiled(graphdef, treedef, self.cache_dtype)
        filtered = any(r.params.temperature > 0 and (r.params.top_k > 0 or r.params.top_p < 1) for r in requests)
        token_b, cache = compiled.prefill(leaves, input_ids_bt, pad_counts_b, sampling, total_length=total_length,
                                          filtered=filtered)
        decoders = [IncrementalDecoder(self.tokenizer) for _ in requests]
        texts, tokens = [""] * count, [[] for _ in requests]
        finish: list[str | None] = [None] * count
        first_token: list[float | None] = [None] * count
        prompt_lengths_b = prompt_length - pad_counts_b
        step = 0
        while True:
            host_tokens = np.asarray(jax.device_get(token_b))
            now = clock()
            for row, request in enumerate(requests):
                if finish[row] is not None:
                    continue
                finish[row] = self._early_finish(row, request, now, should_stop)
                if finish[row] is not None:
                    continue
                token_id = int(host_tokens[row])
                tokens[row].append(token_id)
                first_token[row] = first_token[row] if first_token[row] is not None else now - started
                if token_id in stop_ids[row]:
                    finish[row] = "stop"
                elif len(tokens[row]) >= request.params.max_new_tokens:
                    finish[row] = "length"
                delta = decoders[row].push(token_id) + (decoders[row].flush() if finish[row] else "")
                texts[row] += delta
                if on_token is not None:
                    on_token(row, token_id, delta)
            if all(reason is not None for reason in finish):
                break
            token_b, cache = compiled.decode(leaves, token_b, prompt_lengths_b + step, pad_counts_b, cache, sampling,
                                             np.int32(step + 1), filtered=filtered)
            step += 1
        return [ServeResult(text=self._final_text(texts[row], tokens[row], finish[row]), token_ids=tokens[row],
                            prompt_tokens=len(request.prompt_ids), finish_reason=finish[row],
                            first_token_seconds=first_token[row])
                for row, request in enumerate(requests)]

    def check(self, request: ServeRequest) -> None:
        """Raise ``PromptError`` for a request this model cannot take."""
        config = self.model.config
        if not request.prompt_ids:
            raise PromptError("the prompt is empty; give at least one token")
        if min(request.prompt_ids) < 0 or max(request.prompt_ids) >= config.vocab_size:
            raise PromptError(f"the prompt has token ids outside the model's vocabulary (vocab_size={config.vocab_size})")
        if len(request.prompt_ids) + request.params.max_new_tokens > config.max_position_embeddings:
            raise PromptError(f"the prompt ({len(request.prompt_ids)} tokens) plus max_new_tokens "
                              f"({request.params.max_new_tokens}) exceeds the model's context length "
                              f"({config.max_position_embeddings}); shorten the conversation or generate less")

    def _final_text(self, streamed: str, token_ids: list[int], reason: str) -> str:
        # A stopped row may hold back a partial character in its decoder; the full decode has it.
        return self.tokenizer.decode(token_ids) if reason in ("cancelled", "timeout") else streamed

    @staticmethod
    def _early_finish(row: int, request: ServeRequest, now: float, should_stop: ShouldStop | None) -> str | None:
        if should_stop is not None and should_stop(row):
            return "cancelled"
        if request.deadline is not None and now >= request.deadline:
            return "timeout"
        return None

    @staticmethod
    def _sampling_arrays(requests: Sequence[ServeRequest], batch: int):
        temperature_b = np.zeros((batch,), np.float32)
        top_k_b = np.zeros((batch,), np.int32)
        top_p_b = np.ones((batch,), np.float32)
        seed_b = np.zeros((batch,), np.uint32)
        for row, request in enumerate(requests):
            temperature_b[row] = request.params.temperature
            top_k_b[row] = request.params.top_k
            top_p_b[row] = request.params.top_p
            seed_b[row] = request.params.seed
        return temperature_b, top_k_b, top_p_b, seed_b


@dataclasses.dataclass(kw_only=True)
class _Pending:
    request: ServeRequest
    on_token: Callable[[int, str], None] | None
    should_stop: Callable[[], bool] | None
    future: concurrent.futures.Future


class BatchingServer:
    """Batches the requests that callers on many threads submit for one model (see the module note)."""

    def __init__(self, decoder: BatchDecoder, *, max_batch: int = 64):
        self.decoder = decoder
        self.max_batch = max_batch
        self.batch_sizes: list[int] = []  # size of every batch run, for tests and benchmarks
        self._pending: queue.Queue[_Pending | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="batching-server", daemon=True)
        self._thread.start()

    def submit(self, request: ServeRequest, *, on_token: Callable[[int, str], None] | None = None,
               should_stop: Callable[[], bool] | None = None) -> concurrent.futures.Future:
        """Queue a request (``PromptError`` at once if the model cannot take it); the future resolves to its ``ServeResult`` (or the batch's exception).
        ``on_token(token_id, delta)`` and ``should_stop()`` run on the server's thread."""
        self.decoder.check(request)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._pending.put(_Pending(request=request, on_token=on_token, should_stop=should_stop, future=future))
        return future

    def close(self, *, wait: bool = True) -> None:
        """Stop the loop thread once the requests already submitted are done (``wait``: until then)."""
        self._pending.put(None)
        if wait:
            self._thread.join()

    def _loop(self) -> None:
        while True:
            first = self._pending.get()
            if first is None:
                return
            batch = [first]
            closing = False
            while len(batch) < self.max_batch:
                try:
                    item = self._pending.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                    break
                batch.append(item)
            self._run(batch)
            if closing:
                return

    def _run(self, batch: list[_Pending]) -> None:
        self.batch_sizes.append(len(batch))

        def on_token(row: int, token_id: int, delta: str) -> None:
            if batch[row].on_token is not None:
                batch[row].on_token(token_id, delta)

        def should_stop(row: int) -> bool:
            return batch[row].should_stop is not None and batch[row].should_stop()

        try:
            results = self.decoder.run([item.request for item in batch], on_token=on_token, should_stop=should_stop)
        except Exception as error:  # the callers report it; the loop keeps serving
            for item in batch:
                item.future.set_exception(error)
            return
        for item, result in zip(batch, results):
            item.future.set_result(result)
