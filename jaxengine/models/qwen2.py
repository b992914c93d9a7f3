"""Qwen 2.5: config.json reading/writing, size presets, weight names.

Llama's architecture with biases on the q/k/v projections (not on o_proj). Optional
sliding-window layers (``use_sliding_window``, off in released checkpoints) come from
``layer_types`` or from ``max_window_layers``.
"""
from __future__ import annotations

from typing import Any

from jaxengine.models.config import (FAMILY_ARCHITECTURES, FAMILY_MODEL_TYPES, FAMILY_WEIGHT_PREFIXES, ModelConfig,
                                     model_class)
from jaxengine.models.llama import llama_like_fields, llama_like_to_hf

ARCHITECTURES = FAMILY_ARCHITECTURES["qwen2"]
MODEL_TYPES = FAMILY_MODEL_TYPES["qwen2"]
WEIGHT_PREFIXES = FAMILY_WEIGHT_PREFIXES["qwen2"]


def sliding_layer_fields(hf: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """layer_types / sliding_window of a Qwen 2.5 or Qwen 3 config.json (as transformers derives them)."""
    if not hf.get("use_sliding_window") or not hf.get("sliding_window"):
        return dict(layer_types=("full_attention",) * num_layers, sliding_window=None)
    layer_types = hf.get("layer_types")
    if layer_types is None:
        first_sliding = hf.get("max_window_layers", 28)
        layer_types = ["sliding_attention" if i >= first_sliding else "full_attention" for i in range(num_layers)]
    return dict(layer_types=tuple(layer_types), sliding_window=int(hf["sliding_window"]))


def sliding_layer_to_hf(config: ModelConfig) -> dict[str, Any]:
    return {
        "use_sliding_window": config.has_sliding_layers,
        "sliding_window": config.sliding_window,
        "layer_types": list(config.layer_types),
    }


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a Qwen 2.5 config.json dict."""
    fields = llama_like_fields(hf, family="qwen2")
    fields.update(sliding_layer_fields(hf, fields["num_layers"]))
    return ModelConfig(**fields, qkv_bias=True)


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """Qwen 2.5 config.json dict for ``config``."""
    out = llama_like_to_hf(config, architecture="Qwen2ForCausalLM", model_type="qwen2")
    out.update(sliding_layer_to_hf(config))
    return out


PRESETS = {
    "qwen2.5-0.5b": ModelConfig(
        family="qwen2", vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
        num_kv_heads=2, head_dim=64, rms_norm_eps=1e-6, max_position_embeddings=32_768, rope_theta=1_000_000.0,
        tie_word_embeddings=True, qkv_bias=True, bos_token_id=151_643, eos_token_ids=(151_645, 151_643),
        pad_token_id=151_643,
    ),
    "qwen2.5-1.5b": ModelConfig(
        family="qwen2", vocab_size=151_936, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
        num_kv_heads=2, head_dim=128, rms_norm_eps=1e-6, max_position_embeddings=32_768, rope_theta=1_000_000.0,
        tie_word_embeddings=True, qkv_bias=True, bos_token_id=151_643, eos_token_ids=(151_645, 151_643),
        pad_token_id=151_643,
    ),
    "tiny-qwen2": ModelConfig(
        family="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=256, rope_theta=1_000_000.0,
        tie_word_embeddings=False, qkv_bias=True, bos_token_id=1, eos_token_ids=(2,), pad_token_id=0,
    ),
}


def __getattr__(name: str):
    # The NNX class imports jax, which reading a config.json must not: the web app reads one through this module.
    if name in ("Qwen2ForCausalLM", "MODEL_CLASS"):
        return model_class(__name__, "Qwen2ForCausalLM",
                           "Qwen 2.5 causal language model (see ``CausalLM`` for the call API).")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
