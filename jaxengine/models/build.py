"""Constructing models of any family."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxengine.models.config import ModelConfig, family_module
from jaxengine.models.transformer import CausalLM


def build_model(config: ModelConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32, compute_dtype=jnp.float32,
                remat: bool = False, attention_implementation: str = "auto") -> CausalLM:
    """A randomly initialised model of ``config``'s family (weights: normal(0.02), norms neutral).

    ``param_dtype`` is the storage dtype of parameters; ``compute_dtype`` the dtype of
    activations and matmul inputs (float32 or bfloat16 each). Logits are always float32.
    ``remat`` recomputes each layer in the backward pass instead of keeping its activations.
    ``attention_implementation`` ("auto" | "xla" | "cudnn") is the kernel of the fused attention
    path (see ``jaxengine.models.layers.resolve_attention_implementation``).
    """
    model_class = family_module(config.family).MODEL_CLASS
    return model_class(config, rngs=rngs, param_dtype=param_dtype, compute_dtype=compute_dtype, remat=remat,
                       attention_implementation=attention_implementation)


def param_count(model: nnx.Module) -> int:
    """Number of parameter scalars in ``model`` (works on abstract models too)."""
    return sum(int(leaf.size) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
