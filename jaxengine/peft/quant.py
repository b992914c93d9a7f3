"""Block-wise weight quantization for QLoRA: 4-bit NF4 (Dettmers et al. 2023) and 8-bit absmax.

Design note: a kernel [in, out] is cut into groups of ``group_size`` consecutive input rows per
output column; each group stores one float32 scale (its absolute maximum) and one code per weight.
NF4 codes index a 16-value table of normal-distribution quantiles in [-1, 1] and are packed two
per byte along the input axis; int8 codes are ``round(127 * w / scale)``. Storage per weight is
0.5 + 4 / group_size bytes for NF4 (0.28x bfloat16 at group 64) and 1 + 4 / group_size for int8.
``QuantizedKernel.dequantize()`` rebuilds the kernel in the compute dtype inside the matmul's jit,
so the full-precision weights never persist in memory.

Error bounds (tested): NF4 is within half the widest gap of its table (0.152) times the group's
absmax of the original weight; int8 within absmax / 254.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# The NF4 table of bitsandbytes / the QLoRA paper.
NF4_CODEBOOK = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
], np.float32)
NF4_MAX_HALF_GAP = float(np.max(np.diff(NF4_CODEBOOK)) / 2)


class QuantizedWeight(nnx.Variable):
    """Frozen quantized storage (codes or scales); never trained, never saved as a Hugging Face tensor."""


def _grouped(kernel_io: jax.Array, group_size: int) -> jax.Array:
    rows, cols = kernel_io.shape
    if rows % group_size:
        raise ValueError(f"peft.group_size: {group_size} does not divide the input width {rows} of a projection; "
                         "pick a power of two that divides every hidden and intermediate size")
    return kernel_io.reshape(rows // group_size, group_size, cols)  # [G, g, out]


def quantize(kernel_io: jax.Array, *, bits: int, group_size: int) -> tuple[jax.Array, jax.Array]:
    """(codes, scales) of a kernel [in, out]: NF4 codes packed [in / 2, out] uint8, or int8 codes [in, out];
    scales float32 [in / group_size, out]."""
    grouped_ggo = _grouped(kernel_io.astype(jnp.float32), group_size)
    scales_go = jnp.max(jnp.abs(grouped_ggo), axis=1)
    safe_go = jnp.where(scales_go > 0, scales_go, 1.0)
    normalized_ggo = grouped_ggo / safe_go[:, None, :]
    if bits == 8:
        codes = jnp.round(normalized_ggo * 127.0).astype(jnp.int8)
        return codes.reshape(kernel_io.shape), scales_go
    if bits != 4:
        raise ValueError(f"peft.quant_bits: {bits} is not one of 4, 8")
    midpoints = jnp.asarray((NF4_CODEBOOK[1:] + NF4_CODEBOOK[:-1]) / 2)
    codes_io = jnp.searchsorted(midpoints, normalized_ggo).astype(jnp.uint8).reshape(kernel_io.shape)
    packed = codes_io[0::2] | (codes_io[1::2] << 4)  # rows 2i (low nibble) and 2i+1 (high nibble)
    return packed, scales_go


def dequantize(codes: jax.Array, scales_go: jax.Array, *, bits: int, group_size: int, dtype) -> jax.Array:
    """The kernel [in, out] in ``dtype`` from ``quantize``'s output."""
    if bits == 8:
        values_io = codes.astype(jnp.float32) / 127.0
    else:
        low, high = codes & 0x0F, codes >> 4
        indices_io = jnp.stack([low, high], axis=1).reshape(codes.shape[0] * 2, codes.shape[1])
        values_io = jnp.asarray(NF4_CODEBOOK)[indices_io]
    grouped = _grouped(values_io, group_size) * scales_go[:, None, :]
    return grouped.reshape(values_io.shape).astype(dtype)


class QuantizedKernel(nnx.Module):
    """A frozen kernel [in, out] kept quantized; ``dequantize()`` gives it back in the compute dtype."""

    def __init__(self, kernel_io: jax.Array, *, bits: int, group_size: int, compute_dtype, axes: tuple):
        codes, scales = quantize(kernel_io, bits=bits, group_size=group_size)
        # Codes [in / 2 or in, out] and scales [in / group_size, out] are split like the kernel they stand
        # for (jaxengine.sharding; an axis the mesh does not divide stays whole).
        self.codes = QuantizedWeight(codes, logical_axes=tuple(axes))
        self.scales = QuantizedWeight(scales, logical_axes=tuple(axes))
        self.bits = bits
        self.group_size = group_size
        self.compute_dtype = compute_dtype
        self.param_dtype = kernel_io.dtype
        self.axes = tuple(axes)

    def dequantize(self, dtype=None) -> jax.Array:
        return dequantize(self.codes[...], self.scales[...], bits=self.bits, group_size=self.group_size,
                          dtype=dtype or self.compute_dtype)

    @property
    def nbytes(self) -> int:
        return int(self.codes[...].nbytes + self.scales[...].nbytes)


def quantize_model(model: nnx.Module, *, bits: int, group_size: int) -> dict[str, float]:
    """Replace every projection kernel (q/k/v/o/gate/up/down) with a ``QuantizedKernel``.

    Returns the measured storage: quantized bytes, their bfloat16 size, and the ratio.
    """
    from jaxengine.models.layers import Linear
    from jaxengine.peft.lora import PROJECTIONS

    stored, bf16 = 0, 0
    for path, linear in nnx.iter_modules(model):
        if not (isinstance(linear, Linear) and path and path[-1] in PROJECTIONS and linear.quantized is None):
            continue
        kernel = linear.kernel
        quantized = QuantizedKernel(kernel[...], bits=bits, group_size=group_size,
                                    compute_dtype=linear.compute_dtype,
                                    axes=kernel.get_metadata().get("logical_axes", (None, None)))
        linear.quantized = nnx.data(quantized)
        del linear.kernel
        stored += quantized.nbytes
        bf16 += 2 * int(np.prod(kernel.shape))
    return {"quantized_bytes": stored, "bfloat16_bytes": bf16, "ratio_to_bfloat16": stored / max(bf16, 1)}


def dequantize_model(model: nnx.Module) -> None:
    """Give every quantized projection a plain kernel again (e.g. before merging LoRA and exporting)."""
    from jaxengine.models.layers import Linear, param

    for _, linear in nnx.iter_modules(model):
        if isinstance(linear, Linear) and linear.quantized is not None:
            quantized = linear.quantized
            linear.kernel = param(quantized.dequantize(quantized.param_dtype), quantized.axes)
            linear.quantized = nnx.data(None)
