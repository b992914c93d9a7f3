"""Model families (Llama 3.x, Qwen 2.5, Qwen 3, Gemma 3 text) as Flax NNX modules.

Public API: ``build_model``, ``ModelConfig``, ``from_hf_config``, ``to_hf_config``, ``preset``,
``KVCache``. Every model is a ``CausalLM``:

    logits_btv, cache = model(input_ids_bt, positions_bt, attention_mask_bts=None, cache=None)
    hidden_btd, cache = model.hidden_states(input_ids_bt, positions_bt, attention_mask_bts=None, cache=None)
    logits_btv = model.logits(hidden_btd)
    cache = model.init_cache(batch_size=B, max_length=S, dtype=None)

Importing this package imports jax; ``jaxengine.models.config`` alone does not.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from jaxengine.models.config import (
    ModelConfig,
    RopeScaling,
    UnsupportedArchitectureError,
    family_module,
    from_hf_config,
    preset,
    preset_names,
    to_hf_config,
)
from jaxengine.models.transformer import CausalLM, KVCache, causal_mask


def build_model(config: ModelConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32, compute_dtype=jnp.float32
                ) -> CausalLM:
    """A randomly initialised model of ``config``'s family (weights: normal(0.02), norms neutral).

    ``param_dtype`` is the storage dtype of parameters; ``compute_dtype`` the dtype of
    activations and matmul inputs (float32 or bfloat16 each). Logits are always float32.
    """
    model_class = family_module(config.family).MODEL_CLASS
    return model_class(config, rngs=rngs, param_dtype=param_dtype, compute_dtype=compute_dtype)


__all__ = [
    "CausalLM",
    "KVCache",
    "ModelConfig",
    "RopeScaling",
    "UnsupportedArchitectureError",
    "build_model",
    "causal_mask",
    "from_hf_config",
    "preset",
    "preset_names",
    "to_hf_config",
]
