"""Model families (Llama 3.x, Qwen 2.5, Qwen 3, Gemma 3 text) as Flax NNX modules.

Public API: ``build_model``, ``ModelConfig``, ``from_hf_config``, ``to_hf_config``, ``preset``,
``KVCache``. Every model is a ``CausalLM``:

    logits_btv, cache = model(input_ids_bt, positions_bt, attention_mask_bts=None, cache=None)
    hidden_btd, cache = model.hidden_states(input_ids_bt, positions_bt, attention_mask_bts=None, cache=None)
    logits_btv = model.logits(hidden_btd)
    cache = model.init_cache(batch_size=B, max_length=S, dtype=None)

The config names import without jax; the jax-backed names (``build_model``, ``CausalLM``,
``KVCache``, ``causal_mask``, ``param_count``) load on first access, so that jax-free callers can
use ``jaxengine.models.config``.
"""
from __future__ import annotations

import importlib
from typing import Any

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

_LAZY = {
    "build_model": "jaxengine.models.build",
    "param_count": "jaxengine.models.build",
    "CausalLM": "jaxengine.models.transformer",
    "KVCache": "jaxengine.models.transformer",
    "causal_mask": "jaxengine.models.transformer",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxengine.models' has no attribute {name!r}")


__all__ = [
    "CausalLM",
    "KVCache",
    "ModelConfig",
    "RopeScaling",
    "UnsupportedArchitectureError",
    "build_model",
    "causal_mask",
    "family_module",
    "from_hf_config",
    "param_count",
    "preset",
    "preset_names",
    "to_hf_config",
]
