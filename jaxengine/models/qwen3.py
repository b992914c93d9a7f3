"""Qwen 3 (dense): config.json reading/writing, size presets, weight names.

Llama's architecture with RMSNorm on each query and key head (``q_norm``/``k_norm``, over
head_dim, before rotary) and an explicit ``head_dim`` that need not equal hidden / heads.
"""
from __future__ import annotations

from typing import Any

from jaxengine.models.config import (FAMILY_ARCHITECTURES, FAMILY_MODEL_TYPES, FAMILY_WEIGHT_PREFIXES, ModelConfig,
                                     model_class)
from jaxengine.models.llama import llama_like_fields, llama_like_to_hf
from jaxengine.models.qwen2 import sliding_layer_fields, sliding_layer_to_hf

ARCHITECTURES = FAMILY_ARCHITECTURES["qwen3"]
MODEL_TYPES = FAMILY_MODEL_TYPES["qwen3"]
WEIGHT_PREFIXES = FAMILY_WEIGHT_PREFIXES["qwen3"]


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a Qwen 3 config.json dict."""
    fields = llama_like_fields(hf, family="qwen3")
    fields.update(sliding_layer_fields(hf, fields["num_layers"]))
    attention_bias = bool(hf.get("attention_bias", False))
    return ModelConfig(**fields, qk_norm=True, qkv_bias=attention_bias, o_proj_bias=attention_bias)


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """Qwen 3 config.json dict for ``config``."""
    out = llama_like_to_hf(config, architecture="Qwen3ForCausalLM", model_type="qwen3")
    out.update(sliding_layer_to_hf(config), attention_bias=config.qkv_bias)
    return out


PRESETS = {
    "qwen3-0.6b": ModelConfig(
        family="qwen3", vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
        num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6, max_position_embeddings=40_960, rope_theta=1_000_000.0,
        tie_word_embeddings=True, qk_norm=True, bos_token_id=151_643, eos_token_ids=(151_645,),
        pad_token_id=151_643,
    ),
    "qwen3-1.7b": ModelConfig(
        family="qwen3", vocab_size=151_936, hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16,
        num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6, max_position_embeddings=40_960, rope_theta=1_000_000.0,
        tie_word_embeddings=True, qk_norm=True, bos_token_id=151_643, eos_token_ids=(151_645,),
        pad_token_id=151_643,
    ),
    "tiny-qwen3": ModelConfig(
        family="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=256, rope_theta=1_000_000.0,
        tie_word_embeddings=True, qk_norm=True, bos_token_id=1, eos_token_ids=(2,), pad_token_id=0,
    ),
}


def __getattr__(name: str):
    # The NNX class imports jax, which reading a config.json must not: the web app reads one through this module.
    if name in ("Qwen3ForCausalLM", "MODEL_CLASS"):
        return model_class(__name__, "Qwen3ForCausalLM",
                           "Qwen 3 dense causal language model (see ``CausalLM`` for the call API).")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
