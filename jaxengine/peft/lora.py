"""LoRA (Hu et al. 2021) on the shared ``Linear`` projection, with merge/unmerge and PEFT export.

Design note: every q/k/v/o/gate/up/down projection of every family is a
``jaxengine.models.layers.Linear``, whose output adds ``self.lora(x)`` when an adapter is set, so
LoRA is attached by assigning ``linear.lora`` for the targeted projections; nothing else in the
models knows about it. Adapter weights are ``LoraParam`` variables, deliberately *not*
``nnx.Param``: Hugging Face loading/saving and parameter counts see only the base model, and the
trainer picks the trainable set with the ``LoraParam`` filter. ``merge_lora`` folds
``scale * A @ B`` into each kernel (and marks the adapter merged so it stops adding its update);
``unmerge_lora`` subtracts it again. Export to the ``peft`` library's format transposes to its
[out, in] layout under ``base_model.model.<HF module name>.lora_A/B.weight``.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxengine.checkpoint.hf import hf_weight_name, write_safetensors
from jaxengine.models.layers import Linear

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraParam(nnx.Variable):
    """A LoRA adapter weight (trainable under LoRA; invisible to Hugging Face checkpoint code)."""


class LoraAdapter(nnx.Module):
    """``scale * dropout(x) @ A @ B`` with A [in, r] (Kaiming-uniform, as peft) and B [r, out] (zeros)."""

    def __init__(self, in_features: int, out_features: int, *, rank: int, alpha: float, dropout: float,
                 compute_dtype, rngs: nnx.Rngs, axes: tuple[str | None, str | None] = (None, None)):
        bound = 1.0 / math.sqrt(in_features)
        # ``axes``: the logical axes of the adapted kernel [in, out]; A and B are split like its input and
        # output sides (jaxengine.sharding), the rank axis stays whole.
        self.lora_a = LoraParam(jax.random.uniform(rngs.params(), (in_features, rank), jnp.float32, -bound, bound),
                                logical_axes=(axes[0], None))
        self.lora_b = LoraParam(jnp.zeros((rank, out_features), jnp.float32), logical_axes=(None, axes[1]))
        self.scale = alpha / rank
        self.compute_dtype = compute_dtype
        self.dropout = nnx.Dropout(dropout, rngs=rngs) if dropout > 0 else None
        self.merged = False

    def delta_kernel(self) -> jax.Array:
        """The update ``scale * A @ B`` [in, out] in float32 that merging adds to the kernel."""
        return self.scale * (self.lora_a[...] @ self.lora_b[...])

    def __call__(self, x_bti: jax.Array) -> jax.Array:
        """Float32 update [..., out] for input x (zero once merged into the kernel)."""
        if self.merged:
            return jnp.zeros((), jnp.float32)
        if self.dropout is not None:
            x_bti = self.dropout(x_bti)
        dtype = self.compute_dtype
        h_nr = _flat_matmul(x_bti.astype(dtype), self.lora_a[...].astype(dtype))
        y_no = _flat_matmul(h_nr.astype(dtype), self.lora_b[...].astype(dtype))
        return self.scale * y_no.reshape(*x_bti.shape[:-1], y_no.shape[-1])


def _flat_matmul(x: jax.Array, w_io: jax.Array) -> jax.Array:
    """``x @ w`` as float32 [N, O] with x's leading axes flattened into one (N = their product).

    The same products as an einsum over "...I,IO->...O", but the gradients of A and B (the only
    weight gradients a LoRA step computes) become plain matrix products. Over the leading axes
    [B, T] kept apart, XLA on CPU lays the [B, T, O] output gradient out transposed before
    contracting it: a strided copy of the gate/up gradients that took more time than the matmuls
    (bench/RESULTS.md, "LoRA SFT every position: where the step's time went").
    """
    return jnp.einsum("NI,IO->NO", x.reshape(-1, x.shape[-1]), w_io, preferred_element_type=jnp.float32)


def _targeted_linears(model: nnx.Module, targets: Sequence[str]) -> list[tuple[tuple, Linear]]:
    return [(path, module) for path, module in nnx.iter_modules(model)
            if isinstance(module, Linear) and path and path[-1] in targets]


def apply_lora(model: nnx.Module, *, targets: Sequence[str], rank: int, alpha: float, dropout: float = 0.0,
               seed: int = 0) -> int:
    """Attach a fresh adapter to every ``Linear`` named in ``targets``; returns how many were attached."""
    unknown = sorted(set(targets) - set(PROJECTIONS))
    if unknown:
        raise ValueError(f"peft.targets: {unknown} are not projections; allowed: {', '.join(PROJECTIONS)}")
    rngs = nnx.Rngs(params=seed, dropout=seed + 1)
    found = _targeted_linears(model, targets)
    if not found:
        raise ValueError(f"peft.targets {list(targets)} match no projection of this model")
    for _, linear in found:
        axes = (linear.quantized.axes if linear.quantized is not None
                else linear.kernel.get_metadata().get("logical_axes", (None, None)))
        linear.lora = nnx.data(LoraAdapter(linear.in_features, linear.out_features, rank=rank, alpha=alpha,
                                           dropout=dropout, compute_dtype=linear.compute_dtype, rngs=rngs,
                                           axes=axes))
    return len(found)


def _adapted(model: nnx.Module) -> list[tuple[tuple, Linear]]:
    return [(path, module) for path, module in nnx.iter_modules(model)
            if isinstance(module, Linear) and module.lora is not None]


def merge_lora(model: nnx.Module) -> None:
    """Fold every adapter into its kernel (kernel += scale * A @ B); adapters then add nothing."""
    for _, linear in _adapted(model):
        if not linear.lora.merged:
            kernel = linear.kernel[...]
            linear.kernel[...] = (kernel.astype(jnp.float32) + linear.lora.delta_kernel()).astype(kernel.dtype)
            linear.lora.merged = True


def unmerge_lora(model: nnx.Module) -> None:
    """Undo ``merge_lora``: subtract each adapter's update from its kernel and re-enable the adapter."""
    for _, linear in _adapted(model):
        if linear.lora.merged:
            kernel = linear.kernel[...]
            linear.kernel[...] = (kernel.astype(jnp.float32) - linear.lora.delta_kernel()).astype(kernel.dtype)
            linear.lora.merged = False


def remove_lora(model: nnx.Module) -> None:
    """Detach every adapter (after merging, the model is then a plain base model again)."""
    for _, linear in _adapted(model):
        linear.lora = nnx.data(None)


def save_peft_adapter(model: nnx.Module, out_dir: str | Path, *, base_model: str, rank: int, alpha: float,
                      dropout: float, targets: Sequence[str]) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` that ``peft.PeftModel`` loads onto the base."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    for path, linear in _adapted(model):
        name, _ = hf_weight_name((*path, "kernel"))
        stem = "base_model.model." + name.removesuffix(".weight")
        tensors[f"{stem}.lora_A.weight"] = np.ascontiguousarray(np.asarray(linear.lora.lora_a[...], np.float32).T)
        tensors[f"{stem}.lora_B.weight"] = np.ascontiguousarray(np.asarray(linear.lora.lora_b[...], np.float32).T)
    write_safetensors(tensors, out_dir / "adapter_model.safetensors", metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": sorted(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir
