"""Shared building blocks of every model family: projection, norms, rotary embedding, attention, MLP.

Design notes:
- Every q/k/v/o/gate/up/down/lm_head projection is a ``Linear``, so adapters (LoRA, QLoRA)
  extend one class. Kernels are stored ``[in, out]`` (Hugging Face stores ``[out, in]``; the
  checkpoint code transposes).
- Every parameter is an ``nnx.Param`` carrying ``logical_axes`` metadata (a tuple of logical
  axis names, one per dimension). ``jaxengine.sharding`` maps them onto a mesh. We keep our
  own metadata key rather than flax's ``out_sharding`` because flax shards eagerly on
  creation when that key is present, which needs a mesh at build time.
- Parameters are stored in ``param_dtype``; every op casts to ``compute_dtype``. Norm
  statistics, softmax and logits are float32 whatever the compute dtype.
- Attention is grouped-query: the G = N / K query heads sharing a key/value head are folded
  into the query axis ([F, Q, H] with F = B * K, Q = G * T), so keys and values are never
  repeated in memory, and the cache is stored in exactly the layout the matmuls read
  (``kv_cache_shapes``).
- Two attention paths. The general one (``dot_product_attention`` below) takes any boolean mask
  [B, T, S] (packed segments, KV-cache slots, sliding windows) and materialises float32 scores
  [F, Q, S]. The fused one (``fused_attention``) serves the common training/prefill case,
  causal attention over right-padded rows given by their lengths, through
  ``jax.nn.dot_product_attention``: with ``implementation="cudnn"`` that is cuDNN's flash
  attention, which never materialises the scores (at 16 x 2048 tokens on a 0.6B model the scores
  are the largest activation by far). ``attention_implementation`` picks the kernel.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxengine.models.config import ModelConfig, RopeScaling
from jaxengine.sharding import constrain, constrain_kv_cache

Axes = tuple[str | None, ...]
# Filled into masked attention scores; finite so that a fully masked row (padding) gives a
# uniform distribution instead of NaN.
MASK_VALUE = float(np.finfo(np.float32).min)
INIT_STDDEV = 0.02
# Logical axes of the residual stream [B, T, D] (jaxengine.sharding.ACTIVATION_RULES).
RESIDUAL_AXES = ("batch", "length", "act_embed")


def param(value: jax.Array, axes: Axes) -> nnx.Param:
    """An ``nnx.Param`` tagged with one logical axis name per dimension."""
    if len(axes) != value.ndim:
        raise ValueError(f"logical axes {axes} do not match a parameter of shape {value.shape}")
    return nnx.Param(value, logical_axes=tuple(axes))


def normal_init(rngs: nnx.Rngs, shape: tuple[int, ...], dtype) -> jax.Array:
    return (INIT_STDDEV * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)


class Linear(nnx.Module):
    """``y = x @ kernel (+ bias)``; kernel [in, out]. The one projection every family uses."""

    def __init__(self, in_features: int, out_features: int, *, use_bias: bool, axes: tuple[str, str],
                 param_dtype, compute_dtype, rngs: nnx.Rngs):
        self.in_features = in_features
        self.out_features = out_features
        self.compute_dtype = compute_dtype
        self.kernel = param(normal_init(rngs, (in_features, out_features), param_dtype), axes)
        self.bias = param(jnp.zeros((out_features,), param_dtype), (axes[1],)) if use_bias else None
        # A LoRA adapter (jaxengine.peft.lora.apply_lora) that adds its low-rank update to the output.
        self.lora = nnx.data(None)
        # QLoRA: the frozen kernel stored quantized (jaxengine.peft.quant.quantize_model), replacing ``kernel``.
        self.quantized = nnx.data(None)

    def _kernel_after(self, x_bti: jax.Array) -> jax.Array:
        """The kernel [in, out]; a quantized one is rebuilt only once its input ``x_bti`` exists.

        Quantized codes (QLoRA's, a serving copy's) depend on no activation, so XLA may dequantize every
        projection of the model at the start of a program (a prefill, a decode step, a forward pass), or
        hoist them out of a decode loop, and hold them all in the compute dtype: the memory the codes exist
        to save. Codes and scales plus a zero made from one input value make the whole rebuild wait for the
        projection's input: one layer's kernels at a time, never loop-invariant. (An optimization barrier
        would not do: XLA's CPU pipeline drops barriers before it schedules.) ``int(0 * v)`` is no constant
        to XLA (a float v may be NaN), and is 0 for every v: the codes and scales are unchanged
        (bench/RESULTS.md, "QLoRA's kernels dequantized one layer at a time"). A rematerialized layer sets
        ``kernel_waits_for_input`` False (``transformer._remat_layer``)."""
        if self.quantized is None:
            return self.kernel[...]
        if not getattr(self, "kernel_waits_for_input", True):
            return self.quantized.dequantize()
        zero = (0 * jax.lax.stop_gradient(x_bti.reshape(-1)[0])).astype(jnp.int32)
        graphdef, arrays = nnx.split(self.quantized)
        arrays = jax.tree.map(lambda array: array + zero.astype(array.dtype), arrays)
        return nnx.merge(graphdef, arrays).dequantize()

    def __call__(self, x_bti: jax.Array, *, out_dtype=None) -> jax.Array:
        """Project the last axis; the result is ``out_dtype`` (default: the compute dtype)."""
        out_dtype = out_dtype or self.compute_dtype
        y_bto = jnp.einsum(
            "...I,IO->...O", x_bti.astype(self.compute_dtype), self._kernel_after(x_bti).astype(self.compute_dtype),
            preferred_element_type=jnp.float32,
        )
        if self.bias is not None:
            y_bto = y_bto + self.bias[...].astype(jnp.float32)
        if self.lora is not None:
            y_bto = y_bto + self.lora(x_bti)
        return y_bto.astype(out_dtype)


def joined_projection(projections: list[Linear]) -> Linear | None:
    """One ``Linear`` whose output is the outputs of ``projections`` side by side: kernels (and biases)
    joined along the output axis, so a decode step does one matmul instead of several small ones.
    For serving (``transformer.fuse_projections``); None when the projections cannot be joined exactly
    (a LoRA adapter, quantized codes, or different input widths, biases or dtypes)."""
    first = projections[0]
    kinds = {(linear.in_features, linear.bias is None, linear.compute_dtype, linear.kernel[...].dtype)
             for linear in projections if linear.lora is None and linear.quantized is None}
    if len(kinds) != 1 or any(linear.lora is not None or linear.quantized is not None for linear in projections):
        return None
    kernel_io = jnp.concatenate([linear.kernel[...] for linear in projections], axis=1)
    # Built abstract, then given the joined arrays: no throwaway random kernel of the joined size.
    joined = nnx.eval_shape(lambda: Linear(first.in_features, kernel_io.shape[1], use_bias=first.bias is not None,
                                           axes=("embed", None), param_dtype=kernel_io.dtype,
                                           compute_dtype=first.compute_dtype, rngs=nnx.Rngs(0)))
    joined.kernel = param(kernel_io, ("embed", None))
    if first.bias is not None:
        joined.bias = param(jnp.concatenate([linear.bias[...] for linear in projections]), (None,))
    return joined


class Embedding(nnx.Module):
    """Token embedding table [V, D]; also the output projection when embeddings are tied."""

    def __init__(self, vocab_size: int, hidden_size: int, *, param_dtype, compute_dtype, rngs: nnx.Rngs):
        self.compute_dtype = compute_dtype
        self.embedding = param(normal_init(rngs, (vocab_size, hidden_size), param_dtype), ("vocab", "embed"))

    def __call__(self, input_ids_bt: jax.Array) -> jax.Array:
        # Under a mesh the lookup reads the table whole along its width (gathered over fsdp, as FSDP does
        # for every weight at use): XLA cannot turn a width-split lookup result into rows split over
        # (data, fsdp) except by replicating it first. No-op without a mesh.
        table_vd = constrain(self.embedding[...], ("table_vocab", None))
        # Clip rather than jnp.take's default NaN fill: an out-of-range padding id must not become NaN
        # keys/values, which would leak through masked attention as 0 * NaN.
        return jnp.take(table_vd, input_ids_bt, axis=0, mode="clip").astype(self.compute_dtype)

    def attend(self, x_btd: jax.Array) -> jax.Array:
        """Tied output projection: float32 logits [B, T, V]."""
        return jnp.einsum(
            "BTD,VD->BTV", x_btd.astype(self.compute_dtype), self.embedding[...].astype(self.compute_dtype),
            preferred_element_type=jnp.float32,
        )


class RMSNorm(nnx.Module):
    """Root-mean-square norm over the last axis.

    Plain (Llama/Qwen): ``w * normed`` with the product in the input dtype, as Hugging Face does.
    Unit offset (Gemma): ``normed * (1 + w)`` entirely in float32, then cast back.
    """

    def __init__(self, dim: int, *, eps: float, unit_offset: bool, param_dtype, axis_name: str = "norm"):
        self.eps = eps
        self.unit_offset = unit_offset
        init = jnp.zeros if unit_offset else jnp.ones
        self.scale = param(init((dim,), param_dtype), (axis_name,))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        if self.unit_offset:
            return (normed * (1.0 + self.scale[...].astype(jnp.float32))).astype(x.dtype)
        return self.scale[...].astype(x.dtype) * normed.astype(x.dtype)


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
    """Inverse frequencies [H/2] (float32), with Hugging Face's llama3 / linear scaling."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    inv_freq = inv_freq.astype(np.float32)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return (inv_freq / scaling.factor).astype(np.float32)
    # llama3: keep high frequencies, divide low ones by factor, interpolate smoothly in between.
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(positions_bt: jax.Array, inv_freq_h: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """cos and sin tables [B, T, H/2] in float32 for integer positions."""
    angles_bth = positions_bt.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq_h)
    return jnp.cos(angles_bth), jnp.sin(angles_bth)


def apply_rope(x_btnh: jax.Array, cos_bth: jax.Array, sin_bth: jax.Array) -> jax.Array:
    """Rotate the two halves of the head dimension (Hugging Face's ``rotate_half`` layout)."""
    half = x_btnh.shape[-1] // 2
    x32 = x_btnh.astype(jnp.float32)
    first, second = x32[..., :half], x32[..., half:]
    cos, sin = cos_bth[:, :, None, :], sin_bth[:, :, None, :]
    rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return rotated.astype(x_btnh.dtype)


ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")
# cuDNN's fused attention takes 16-bit inputs and head dimensions in multiples of 8 up to 128
# (256 from Hopper on; jax's checks in jax._src.cudnn.fused_attention_stablehlo). ``auto`` keeps
# to 128, which every GPU generation takes; an explicit "cudnn" may try more.
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_HEAD_DIM = 128


def resolve_attention_implementation(requested: str, *, dtype, head_dim: int) -> str:
    """The kernel the fused path uses: ``"cudnn"`` or ``"xla"``.

    ``auto`` is cuDNN on a GPU backend when the dtype and head size fit it, else XLA. An explicit
    ``cudnn`` is honoured as asked, so that a kernel that cannot run fails loudly (e.g. on CPU).
    """
    if requested not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"attention_implementation is {requested!r}; use one of {ATTENTION_IMPLEMENTATIONS}")
    if requested != "auto":
        return requested
    fits_cudnn = (jnp.dtype(dtype) in [jnp.dtype(d) for d in CUDNN_DTYPES]
                  and head_dim <= CUDNN_MAX_HEAD_DIM and head_dim % 8 == 0)
    return "cudnn" if jax.default_backend() == "gpu" and fits_cudnn else "xla"


def fused_attention(q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array, lengths_b: jax.Array, *,
                    scale: float, window: int | None, implementation: str) -> jax.Array:
    """Causal grouped-query self-attention over right-padded rows of ``lengths_b`` real tokens.

    Query t sees keys s <= t with s < length (and t - s < window for a sliding layer), the same as
    the masked path with that mask on every real query; padded query rows come out as zeros. Returns [B, T, N, H] in q's dtype.
    """
    lengths_b = lengths_b.astype(jnp.int32)
    return jax.nn.dot_product_attention(
        q_btnh, k_btkh, v_btkh, scale=scale, is_causal=True, query_seq_lengths=lengths_b,
        key_value_seq_lengths=lengths_b, local_window_size=None if window is None else (window - 1, 0),
        implementation=resolve_attention_implementation(implementation, dtype=q_btnh.dtype,
                                                        head_dim=q_btnh.shape[-1]),
    )


def kv_cache_shapes(batch: int, num_kv_heads: int, max_length: int, head_dim: int
                    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of one layer's (keys, values) cache buffers: [F, H, S] and [F, S, H], F = B * K.

    Batch and key/value heads are flattened into one leading axis F, dropped when F = 1. This is the
    exact operand layout of the two attention matmuls, so the in-place cache write is read back without
    any reshape: XLA (on CPU at least) otherwise duplicates the write into its consumer and copies the
    whole cache on every decode step. Of the two such layouts, this one puts last the axis each product
    keeps (slots for the scores, head dim for the output), so it streams along contiguous memory; the
    other ([F, S, H] keys, [F, H, S] values) makes both products dot products along the last axis,
    which a decode step's few queries per key/value head (Q = G) do not amortise. On CPU, attention
    alone at 16 rows x 2 heads took 1.5-2.2x the time that way (bench/RESULTS.md, "Serving throughput").
    """
    flat = batch * num_kv_heads
    leading = (flat,) if flat > 1 else ()
    return leading + (head_dim, max_length), leading + (max_length, head_dim)


def dot_product_attention(q_fqh: jax.Array, keys_fhs: jax.Array, values_fsh: jax.Array, mask_fqs: jax.Array, *,
                          scale: float, softcap: float | None) -> jax.Array:
    """Attention of queries [F, Q, H] over keys [F, H, S] and values [F, S, H] (F optional).

    F = batch x key/value heads, Q = query heads per key/value head x query length. Scores and
    softmax are float32. Returns [F, Q, H] in the query dtype.
    """
    scores_fqs = jnp.einsum("...QH,...HS->...QS", q_fqh, keys_fhs.astype(q_fqh.dtype),
                            preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        scores_fqs = jnp.tanh(scores_fqs / softcap) * softcap
    scores_fqs = jnp.where(mask_fqs, scores_fqs, MASK_VALUE)
    probs_fqs = jax.nn.softmax(scores_fqs, axis=-1).astype(q_fqh.dtype)
    return jnp.einsum("...QS,...SH->...QH", probs_fqs, values_fsh.astype(q_fqh.dtype),
                      preferred_element_type=jnp.float32).astype(q_fqh.dtype)


class Attention(nnx.Module):
    """Multi-head grouped-query self-attention with optional qkv bias, q/k norm and a KV cache slot."""

    def __init__(self, config: ModelConfig, *, param_dtype, compute_dtype, rngs: nnx.Rngs):
        hidden, heads, kv_heads, head_dim = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.scale = config.attention_scale
        self.softcap = config.attn_logit_softcapping
        common = dict(param_dtype=param_dtype, compute_dtype=compute_dtype, rngs=rngs)
        self.q_proj = Linear(hidden, heads * head_dim, use_bias=config.qkv_bias, axes=("embed", "heads"), **common)
        self.k_proj = Linear(hidden, kv_heads * head_dim, use_bias=config.qkv_bias, axes=("embed", "kv_heads"), **common)
        self.v_proj = Linear(hidden, kv_heads * head_dim, use_bias=config.qkv_bias, axes=("embed", "kv_heads"), **common)
        self.o_proj = Linear(heads * head_dim, hidden, use_bias=config.o_proj_bias, axes=("heads", "embed"), **common)
        # Serving: q/k/v joined into one projection by ``fuse_projections`` (then q/k/v_proj are None).
        self.qkv_proj = nnx.data(None)
        if config.qk_norm:
            norm = dict(eps=config.rms_norm_eps, unit_offset=config.norm_unit_offset, param_dtype=param_dtype,
                        axis_name="head_dim")
            self.q_norm = RMSNorm(head_dim, **norm)
            self.k_norm = RMSNorm(head_dim, **norm)
        else:
            self.q_norm = None
            self.k_norm = None

    def __call__(self, x_btd: jax.Array, *, cos_bth: jax.Array, sin_bth: jax.Array, mask_bts: jax.Array | None,
                 kv_cache: tuple[jax.Array, jax.Array] | None, write_index: jax.Array | None,
                 lengths_b: jax.Array | None = None, window: int | None = None, implementation: str = "auto"
                 ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """Attend from x's T positions to the cache's S slots (or to x itself without a cache).

        With ``kv_cache`` = (keys, values) in the ``kv_cache_shapes`` layout, the new keys and values are
        written at slots [write_index, write_index + T) and the updated pair is returned.
        Without a cache, ``lengths_b`` (int [B], right-padded rows) instead of ``mask_bts`` selects
        the fused causal path (``fused_attention``, ``window`` for a sliding layer, ``implementation``
        one of ``ATTENTION_IMPLEMENTATIONS``).
        """
        batch, length, _ = x_btd.shape
        if self.qkv_proj is None:
            q_btx, k_btx, v_btx = self.q_proj(x_btd), self.k_proj(x_btd), self.v_proj(x_btd)
        else:
            q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            q_btx, k_btx, v_btx = jnp.split(self.qkv_proj(x_btd), [q_width, q_width + kv_width], axis=-1)
        q_btnh = q_btx.reshape(batch, length, self.num_heads, self.head_dim)
        k_btkh = k_btx.reshape(batch, length, self.num_kv_heads, self.head_dim)
        v_btkh = v_btx.reshape(batch, length, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q_btnh = self.q_norm(q_btnh)
            k_btkh = self.k_norm(k_btkh)
        q_btnh = apply_rope(q_btnh, cos_bth, sin_bth)
        k_btkh = apply_rope(k_btkh, cos_bth, sin_bth)
        if lengths_b is not None:
            if kv_cache is not None or mask_bts is not None or self.softcap is not None:
                raise ValueError("Attention: lengths_b selects the fused path, which takes no KV cache, mask "
                                 "or logit softcap; give mask_bts instead")
            out_btnh = fused_attention(q_btnh, k_btkh, v_btkh, lengths_b, scale=self.scale, window=window,
                                       implementation=implementation)
            return self.o_proj(out_btnh.reshape(batch, length, self.num_heads * self.head_dim)), None
        # Flatten to the cache layout (see kv_cache_shapes): F = B * K, Q = G * T.
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        groups = heads // kv_heads
        flat = batch * kv_heads
        q_fqh = q_btnh.reshape(batch, length, kv_heads, groups, head_dim).transpose(0, 2, 3, 1, 4).reshape(
            flat, groups * length, head_dim)
        k_fht = k_btkh.transpose(0, 2, 3, 1).reshape(flat, head_dim, length)
        v_fth = v_btkh.transpose(0, 2, 1, 3).reshape(flat, length, head_dim)
        key_length = mask_bts.shape[-1]
        mask_fqs = jnp.broadcast_to(mask_bts[:, None, None], (batch, kv_heads, groups, length, key_length)).reshape(
            flat, groups * length, key_length)
        if flat == 1:
            q_fqh, k_fht, v_fth, mask_fqs = q_fqh[0], k_fht[0], v_fth[0], mask_fqs[0]
        if kv_cache is None:
            keys_fhs, values_fsh, new_cache = k_fht, v_fth, None
        else:
            cached_keys, cached_values = kv_cache
            leading = (0,) * (cached_keys.ndim - 2)
            keys_fhs = constrain_kv_cache(jax.lax.dynamic_update_slice(
                cached_keys, k_fht.astype(cached_keys.dtype), leading + (0, write_index)),
                batch=batch, kv_heads=kv_heads)
            values_fsh = constrain_kv_cache(jax.lax.dynamic_update_slice(
                cached_values, v_fth.astype(cached_values.dtype), leading + (write_index, 0)),
                batch=batch, kv_heads=kv_heads)
            new_cache = (keys_fhs, values_fsh)
        out_fqh = dot_product_attention(q_fqh, keys_fhs, values_fsh, mask_fqs, scale=self.scale, softcap=self.softcap)
        out_btnh = out_fqh.reshape(batch, kv_heads, groups, length, head_dim).transpose(0, 3, 1, 2, 4)
        return self.o_proj(out_btnh.reshape(batch, length, self.num_heads * self.head_dim)), new_cache


class MLP(nnx.Module):
    """Gated MLP: ``down(act(gate(x)) * up(x))``."""

    def __init__(self, config: ModelConfig, *, param_dtype, compute_dtype, rngs: nnx.Rngs):
        common = dict(use_bias=config.mlp_bias, param_dtype=param_dtype, compute_dtype=compute_dtype, rngs=rngs)
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, axes=("embed", "mlp"), **common)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, axes=("embed", "mlp"), **common)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, axes=("mlp", "embed"), **common)
        self.hidden_act = config.hidden_act
        # Serving: gate/up joined into one projection by ``fuse_projections`` (then gate/up_proj are None).
        self.gate_up_proj = nnx.data(None)

    def __call__(self, x_btd: jax.Array) -> jax.Array:
        if self.gate_up_proj is None:
            gate_btf, up_btf = self.gate_proj(x_btd), self.up_proj(x_btd)
        else:
            gate_btf, up_btf = jnp.split(self.gate_up_proj(x_btd), 2, axis=-1)
        if self.hidden_act == "silu":
            activated_btf = jax.nn.silu(gate_btf)
        else:  # gelu_pytorch_tanh
            activated_btf = jax.nn.gelu(gate_btf, approximate=True)
        return self.down_proj(activated_btf * up_btf)


class DecoderLayer(nnx.Module):
    """Pre-norm residual block; with ``sandwich_norms`` (Gemma) the attention and MLP outputs are
    normed too before joining the residual stream."""

    def __init__(self, config: ModelConfig, *, param_dtype, compute_dtype, rngs: nnx.Rngs):
        norm = dict(eps=config.rms_norm_eps, unit_offset=config.norm_unit_offset, param_dtype=param_dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, **norm)
        self.self_attn = Attention(config, param_dtype=param_dtype, compute_dtype=compute_dtype, rngs=rngs)
        # Llama/Qwen: the norm before the MLP. Gemma: the norm of the attention output.
        self.post_attention_layernorm = RMSNorm(config.hidden_size, **norm)
        self.mlp = MLP(config, param_dtype=param_dtype, compute_dtype=compute_dtype, rngs=rngs)
        if config.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, **norm)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, **norm)
        else:
            self.pre_feedforward_layernorm = None
            self.post_feedforward_layernorm = None

    def __call__(self, x_btd: jax.Array, **attention_kwargs) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        # The residual stream stays split by rows over the batch axes between the blocks (whole on
        # tensor: the tensor-parallel matmuls gather it); no-op without a mesh in context.
        x_btd = constrain(x_btd, RESIDUAL_AXES)
        attended_btd, kv_cache = self.self_attn(self.input_layernorm(x_btd), **attention_kwargs)
        if self.pre_feedforward_layernorm is None:
            x_btd = constrain(x_btd + attended_btd, RESIDUAL_AXES)
            return constrain(x_btd + self.mlp(self.post_attention_layernorm(x_btd)), RESIDUAL_AXES), kv_cache
        x_btd = constrain(x_btd + self.post_attention_layernorm(attended_btd), RESIDUAL_AXES)
        mlp_out_btd = self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x_btd)))
        return constrain(x_btd + mlp_out_btd, RESIDUAL_AXES), kv_cache
