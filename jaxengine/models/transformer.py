"""The decoder-only language model every family instantiates, and its KV cache.

The families differ only in ``ModelConfig`` flags, so one ``CausalLM`` composes the shared
layers; each family module subclasses it under its Hugging Face class name and owns the
config and weight-name mapping. Layers run in a plain Python loop (unrolled under jit):
Gemma 3 mixes sliding and global layers with different rotary tables, and per-layer
modules keep parameter paths identical to Hugging Face names for LoRA targets.

Masking: the caller's ``attention_mask_bts`` (or a causal mask over cache slots when none is
given) is combined with each sliding layer's window, computed from rotary positions: a query
at position p sees keys at positions in (p - window, p]. The cache records the position of
every slot so the window stays right after left padding.

Without a cache, right-padded unpacked rows may be described by their lengths
(``lengths_b``) instead of a dense mask: attention then takes the fused path
(``layers.fused_attention``: cuDNN flash attention on GPU, per ``attention_implementation``)
and no [B, T, T] mask or score tensor is built.
"""
from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from jaxengine.models.config import ModelConfig
from jaxengine.sharding import constrain, constrain_kv_cache
from jaxengine.models.layers import (
    DecoderLayer,
    Embedding,
    Linear,
    RMSNorm,
    joined_projection,
    kv_cache_shapes,
    param,
    resolve_attention_implementation,
    rope_cos_sin,
    rope_inverse_frequencies,
)


@flax.struct.dataclass
class KVCache:
    """Static-shape key/value cache for every layer.

    ``keys[i]``/``values[i]``: layer i's buffers, keys [F, H, S] and values [F, S, H] with F = B * K
    (the F axis is dropped when F = 1; see ``layers.kv_cache_shapes``). ``positions``: [B, S] int32 rotary
    position of the token stored at each slot. ``index``: int32 scalar, the next slot to write
    (shared by all rows).
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    positions: jax.Array
    index: jax.Array

    @property
    def max_length(self) -> int:
        return self.positions.shape[1]


class CausalLM(nnx.Module):
    """Token ids -> float32 next-token logits, with an optional KV cache (see module notes)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32, compute_dtype=jnp.float32,
                 remat: bool = False, attention_implementation: str = "auto"):
        self.config = config
        self.param_dtype = param_dtype
        self.compute_dtype = compute_dtype
        # Rematerialise each decoder layer in the backward pass (keep only layer inputs): trades one
        # extra forward for activation memory when training long sequences. May be switched on an
        # existing model (``model.remat = True``) before it is traced.
        self.remat = remat
        # The fused attention kernel ("auto" | "xla" | "cudnn", see layers.resolve_attention_implementation);
        # may be switched like ``remat``.
        resolve_attention_implementation(attention_implementation, dtype=compute_dtype, head_dim=config.head_dim)
        self.attention_implementation = attention_implementation
        common = dict(param_dtype=param_dtype, compute_dtype=compute_dtype, rngs=rngs)
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, **common)
        self.layers = nnx.List([DecoderLayer(config, **common) for _ in range(config.num_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, unit_offset=config.norm_unit_offset,
                            param_dtype=param_dtype)
        if config.tie_word_embeddings:
            # Data, not static: ``untied_output_projection`` gives an inference copy a head of its own.
            self.lm_head = nnx.data(None)
        else:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, use_bias=False, axes=("embed", "vocab"),
                                  **common)

    def __call__(self, input_ids_bt: jax.Array, positions_bt: jax.Array, *, attention_mask_bts: jax.Array | None = None,
                 cache: KVCache | None = None, lengths_b: jax.Array | None = None) -> tuple[jax.Array, KVCache | None]:
        """Float32 logits [B, T, V] and the advanced cache (None without one)."""
        hidden_btd, cache = self.hidden_states(input_ids_bt, positions_bt, attention_mask_bts=attention_mask_bts,
                                               cache=cache, lengths_b=lengths_b)
        return self.logits(hidden_btd), cache

    def hidden_states(self, input_ids_bt: jax.Array, positions_bt: jax.Array, *,
                      attention_mask_bts: jax.Array | None = None, cache: KVCache | None = None,
                      lengths_b: jax.Array | None = None) -> tuple[jax.Array, KVCache | None]:
        """Final-normed hidden states [B, T, D] (compute dtype) and the advanced cache.

        ``attention_mask_bts``: bool [B, T, S], True where query t may attend key slot s; S = T
        without a cache, the cache's max_length with one. None means causal over slots.
        ``lengths_b``: int [B] real tokens of each right-padded, unpacked row (positions 0, 1, ...),
        instead of a mask and without a cache: causal attention within the first ``length`` tokens.
        """
        config = self.config
        length = input_ids_bt.shape[1]
        if lengths_b is not None:
            if cache is not None or attention_mask_bts is not None:
                raise ValueError("hidden_states: give lengths_b without a cache and without attention_mask_bts")
            if config.attn_logit_softcapping is not None:
                # The fused kernels take no logit softcap: the same mask, built densely.
                key_slots_s = jnp.arange(length, dtype=jnp.int32)
                attention_mask_bts = causal_mask(length, length, offset=None) & (
                    key_slots_s[None, None, :] < lengths_b[:, None, None])
                lengths_b = None
        if cache is None:
            write_index = None
            key_positions_bs = positions_bt
        else:
            write_index = cache.index
            key_positions_bs = constrain(jax.lax.dynamic_update_slice(
                cache.positions, positions_bt.astype(cache.positions.dtype), (0, write_index)), ("batch", "length"))
        key_length = key_positions_bs.shape[1]
        if lengths_b is not None:
            masks = {"full_attention": None, "sliding_attention": None}
        elif attention_mask_bts is None:
            attention_mask_bts = causal_mask(length, key_length, offset=write_index)
        elif attention_mask_bts.shape[-2:] != (length, key_length):
            raise ValueError(
                f"attention_mask_bts has shape {attention_mask_bts.shape}; expected [B, {length}, {key_length}] "
                "(S is the cache's max_length when a cache is given, else the input length)"
            )
        if lengths_b is None:
            masks = {"full_attention": attention_mask_bts}
        if lengths_b is None and config.has_sliding_layers:
            # [B, T, S]: key position within (query position - window, query position].
            distance_bts = positions_bt[:, :, None] - key_positions_bs[:, None, :]
            masks["sliding_attention"] = attention_mask_bts & (distance_bts < config.sliding_window)
        rope_tables = self._rope_tables(positions_bt)

        x_btd = self.embed_tokens(input_ids_bt)
        if config.scale_embeddings:
            # Hugging Face rounds the scale to the parameter dtype before multiplying.
            x_btd = x_btd * jnp.asarray(config.hidden_size ** 0.5, self.param_dtype).astype(x_btd.dtype)
        new_keys, new_values = [], []
        for layer_index, (layer, layer_type) in enumerate(zip(self.layers, config.layer_types)):
            cos_bth, sin_bth = rope_tables[layer_type]
            kv_cache = None if cache is None else (cache.keys[layer_index], cache.values[layer_index])
            # Static per-layer settings of the fused path (plain Python values, not traced).
            static = dict(window=config.sliding_window if layer_type == "sliding_attention" else None,
                          implementation=self.attention_implementation)
            run_layer = functools.partial(_remat_layer if self.remat else _run_layer, **static)
            x_btd, kv_cache = run_layer(layer, x_btd, cos_bth, sin_bth, masks[layer_type], kv_cache, write_index,
                                        lengths_b)
            if kv_cache is not None:
                new_keys.append(kv_cache[0])
                new_values.append(kv_cache[1])
        hidden_btd = self.norm(x_btd)
        if cache is None:
            return hidden_btd, None
        return hidden_btd, KVCache(keys=tuple(new_keys), values=tuple(new_values), positions=key_positions_bs,
                                   index=cache.index + length)

    def logits(self, hidden_btd: jax.Array) -> jax.Array:
        """Float32 logits [B, T, V] from final-normed hidden states (tied embedding or lm_head)."""
        if self.lm_head is None:
            logits_btv = self.embed_tokens.attend(hidden_btd)
        else:
            logits_btv = self.lm_head(hidden_btd, out_dtype=jnp.float32)
        softcap = self.config.final_logit_softcapping
        if softcap is not None:
            logits_btv = jnp.tanh(logits_btv / softcap) * softcap
        return logits_btv

    def init_cache(self, *, batch_size: int, max_length: int, dtype=None) -> KVCache:
        """An empty cache of ``max_length`` slots per row; ``dtype`` defaults to the compute dtype."""
        config = self.config
        dtype = dtype or self.compute_dtype
        keys_shape, values_shape = kv_cache_shapes(batch_size, config.num_kv_heads, max_length, config.head_dim)
        # Rows over (data, fsdp), key/value heads over tensor when a mesh is in context.
        place = functools.partial(constrain_kv_cache, batch=batch_size, kv_heads=config.num_kv_heads)
        return KVCache(
            keys=tuple(place(jnp.zeros(keys_shape, dtype)) for _ in range(config.num_layers)),
            values=tuple(place(jnp.zeros(values_shape, dtype)) for _ in range(config.num_layers)),
            positions=constrain(jnp.zeros((batch_size, max_length), jnp.int32), ("batch", "length")),
            index=jnp.zeros((), jnp.int32),
        )

    def _rope_tables(self, positions_bt: jax.Array) -> dict[str, tuple[jax.Array, jax.Array]]:
        """(cos, sin) [B, T, H/2] per layer type; sliding layers may have their own base."""
        config = self.config
        global_table = rope_cos_sin(
            positions_bt, rope_inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling))
        tables = {"full_attention": global_table, "sliding_attention": global_table}
        if config.has_sliding_layers and config.local_rope_theta is not None:
            tables["sliding_attention"] = rope_cos_sin(
                positions_bt, rope_inverse_frequencies(config.head_dim, config.local_rope_theta, None))
        return tables


def fuse_projections(model: CausalLM) -> CausalLM:
    """A copy of ``model`` for serving in which each layer's q/k/v projections are one matmul
    (``Attention.qkv_proj``) and gate/up one more (``MLP.gate_up_proj``); every other array is shared
    with ``model``, which is left as it was. On CPU a decode step of many rows is several small
    matmuls per layer, each with its own overhead. Projections that cannot be joined exactly (LoRA,
    quantized codes) stay separate; an already fused model comes back as a copy unchanged."""
    fused = nnx.merge(*nnx.split(model))
    for layer in fused.layers:
        attention, mlp = layer.self_attn, layer.mlp
        if attention.qkv_proj is None:
            qkv = joined_projection([attention.q_proj, attention.k_proj, attention.v_proj])
            if qkv is not None:
                attention.qkv_proj, attention.q_proj, attention.k_proj, attention.v_proj = qkv, None, None, None
        if mlp.gate_up_proj is None:
            gate_up = joined_projection([mlp.gate_proj, mlp.up_proj])
            if gate_up is not None:
                mlp.gate_up_proj, mlp.gate_proj, mlp.up_proj = gate_up, None, None
    return fused


def untied_output_projection(model: CausalLM) -> CausalLM:
    """A copy of ``model`` whose tied embedding also has its own output projection: ``lm_head`` with
    the table's transpose as a [D, V] kernel (the table stays for the token lookup). The logits are
    the tied model's to float rounding; a model with an ``lm_head`` already comes back as a copy
    unchanged. For generation on CPU (``inference_layout``), at the cost of V x D more parameters:
    XNNPACK's matrix-vector product over the vocabulary reads a [D, V] kernel about 1.4x faster than
    it reads the [V, D] table as its transpose (bench/RESULTS.md, "Greedy argmax and the inference layout")."""
    untied = nnx.merge(*nnx.split(model))
    if untied.lm_head is None:
        table_vd = untied.embed_tokens.embedding[...]
        vocab_size, hidden_size = table_vd.shape
        # Built abstract, then given the copy: no throwaway random kernel of the vocabulary's size.
        head = nnx.eval_shape(lambda: Linear(hidden_size, vocab_size, use_bias=False, axes=("embed", "vocab"),
                                             param_dtype=table_vd.dtype, compute_dtype=untied.compute_dtype,
                                             rngs=nnx.Rngs(0)))
        head.kernel = param(jnp.transpose(table_vd), ("embed", "vocab"))
        untied.lm_head = head
    return untied


def inference_layout(model: CausalLM) -> CausalLM:
    """A copy of ``model`` laid out for generation from fixed weights (serving, ``jaxengine generate`` and
    ``eval``): projections joined (``fuse_projections``) and, on CPU, a tied embedding's output projection
    as its own kernel (``untied_output_projection``; accelerators read either layout at full speed, so
    there the copy would only cost memory). Not for a model being trained: its layout copies would
    go stale at the first update."""
    fused = fuse_projections(model)
    return untied_output_projection(fused) if jax.default_backend() == "cpu" else fused


def _run_layer(layer: DecoderLayer, x_btd, cos_bth, sin_bth, mask_bts, kv_cache, write_index, lengths_b, *,
               window: int | None, implementation: str):
    return layer(x_btd, cos_bth=cos_bth, sin_bth=sin_bth, mask_bts=mask_bts, kv_cache=kv_cache,
                 write_index=write_index, lengths_b=lengths_b, window=window, implementation=implementation)


def _remat_layer(layer: DecoderLayer, *args, **static):
    """``_run_layer`` under ``jax.checkpoint``: the backward pass recomputes the layer from its inputs.

    The layer's state goes in as an explicit argument of a pure function rather than through
    ``nnx.remat``: under LoRA the trainer differentiates only the adapters, so the frozen base
    ``Param`` objects belong to an outer trace, and ``nnx.remat`` writing state back onto them
    raises flax's TraceContextError. The only state a layer changes is RNG (LoRA dropout draws
    keys), which is returned and written back so the next step draws fresh masks.
    """
    graphdef, state = nnx.split(layer)

    def pure_layer(state, *args):
        inner = nnx.merge(graphdef, state)
        # Quantized kernels rebuilt up front here, not each after its input (``Linear._kernel_after``): under
        # remat that wait held more of the backward pass at once (QLoRA, 12 layers: 158.6 MB of scratch
        # against 144.9; bench/RESULTS.md, "QLoRA's kernels dequantized one layer at a time").
        for _, module in nnx.iter_modules(inner):
            if isinstance(module, Linear):
                module.kernel_waits_for_input = False
        return _run_layer(inner, *args, **static), nnx.state(inner, nnx.RngState)

    outputs, rng_state = jax.checkpoint(pure_layer)(state, *args)
    nnx.update(layer, rng_state)
    return outputs


def causal_mask(query_length: int, key_length: int, *, offset: jax.Array | None) -> jax.Array:
    """[1, T, S] bool: query t (written at slot offset + t) sees slots s <= offset + t."""
    query_slots_t = jnp.arange(query_length, dtype=jnp.int32) + (0 if offset is None else offset)
    key_slots_s = jnp.arange(key_length, dtype=jnp.int32)
    return (key_slots_s[None, :] <= query_slots_t[:, None])[None]
