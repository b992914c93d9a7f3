"""Llama 3.x: config.json reading/writing, size presets, weight names.

Architecture: pre-norm decoder, plain RMSNorm, SiLU gated MLP, grouped-query attention,
rotary embeddings with optional ``llama3`` (3.1/3.2) or ``linear`` scaling, tied or untied
output embeddings. The reading helpers here also serve Qwen 2.5 and Qwen 3, whose configs
share Llama's field names.
"""
from __future__ import annotations

from typing import Any

from jaxengine.models.config import (
    FAMILY_ARCHITECTURES,
    FAMILY_MODEL_TYPES,
    FAMILY_WEIGHT_PREFIXES,
    ModelConfig,
    RopeScaling,
    eos_ids_from_hf,
    eos_ids_to_hf,
    model_class,
    require,
    rope_from_hf,
    rope_to_hf,
)

ARCHITECTURES = FAMILY_ARCHITECTURES["llama"]
MODEL_TYPES = FAMILY_MODEL_TYPES["llama"]
# Hugging Face checkpoints name parameters "model.<our path>" ("lm_head.weight" for the head).
WEIGHT_PREFIXES = FAMILY_WEIGHT_PREFIXES["llama"]


def llama_like_fields(hf: dict[str, Any], *, family: str) -> dict[str, Any]:
    """ModelConfig fields common to Llama, Qwen 2.5 and Qwen 3 config.json files."""
    hidden = require(hf, "hidden_size", family=family)
    heads = require(hf, "num_attention_heads", family=family)
    # transformers 5 nests rope_theta in rope_parameters; older files keep rope_theta / rope_scaling at top level.
    theta, scaling = rope_from_hf(hf.get("rope_parameters"), field="rope_parameters")
    if theta is None and scaling is None:
        theta, scaling = rope_from_hf(hf.get("rope_scaling"), field="rope_scaling")
    theta = hf.get("rope_theta", 10_000.0) if theta is None else theta
    if scaling is not None and scaling.rope_type == "llama3" and "original_max_position_embeddings" not in (
        hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    ):
        scaling = RopeScaling(rope_type="llama3", factor=scaling.factor, low_freq_factor=scaling.low_freq_factor,
                              high_freq_factor=scaling.high_freq_factor,
                              original_max_position_embeddings=hf.get("max_position_embeddings", 8192))
    return dict(
        family=family,
        vocab_size=require(hf, "vocab_size", family=family),
        hidden_size=hidden,
        intermediate_size=require(hf, "intermediate_size", family=family),
        num_layers=require(hf, "num_hidden_layers", family=family),
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hidden // heads,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 8192)),
        rope_theta=float(theta),
        rope_scaling=scaling,
        hidden_act=hf.get("hidden_act", "silu"),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_ids_from_hf(hf.get("eos_token_id")),
        pad_token_id=hf.get("pad_token_id"),
    )


def llama_like_to_hf(config: ModelConfig, *, architecture: str, model_type: str) -> dict[str, Any]:
    """config.json fields common to Llama, Qwen 2.5 and Qwen 3 (transformers 5 layout)."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": rope_to_hf(config.rope_theta, config.rope_scaling),
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos_ids_to_hf(config.eos_token_ids),
        "pad_token_id": config.pad_token_id,
    }


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a Llama config.json dict."""
    attention_bias = bool(hf.get("attention_bias", False))
    return ModelConfig(**llama_like_fields(hf, family="llama"), qkv_bias=attention_bias, o_proj_bias=attention_bias,
                       mlp_bias=bool(hf.get("mlp_bias", False)))


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """Llama config.json dict for ``config``."""
    out = llama_like_to_hf(config, architecture="LlamaForCausalLM", model_type="llama")
    out.update(attention_bias=config.qkv_bias, mlp_bias=config.mlp_bias)
    return out


LLAMA3_ROPE_SCALING = RopeScaling(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=8192)

PRESETS = {
    "llama3.2-1b": ModelConfig(
        family="llama", vocab_size=128_256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
        num_kv_heads=8, head_dim=64, rms_norm_eps=1e-5, max_position_embeddings=131_072, rope_theta=500_000.0,
        rope_scaling=LLAMA3_ROPE_SCALING, tie_word_embeddings=True, bos_token_id=128_000,
        eos_token_ids=(128_001, 128_008, 128_009),
    ),
    "llama3.2-3b": ModelConfig(
        family="llama", vocab_size=128_256, hidden_size=3072, intermediate_size=8192, num_layers=28, num_heads=24,
        num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, max_position_embeddings=131_072, rope_theta=500_000.0,
        rope_scaling=LLAMA3_ROPE_SCALING, tie_word_embeddings=True, bos_token_id=128_000,
        eos_token_ids=(128_001, 128_008, 128_009),
    ),
    "llama3.1-8b": ModelConfig(
        family="llama", vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_layers=32, num_heads=32,
        num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, max_position_embeddings=131_072, rope_theta=500_000.0,
        rope_scaling=RopeScaling(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=8192),
        tie_word_embeddings=False, bos_token_id=128_000, eos_token_ids=(128_001, 128_008, 128_009),
    ),
    # Tiny test size: llama3 scaling with a short original context so that scaling changes frequencies.
    "tiny-llama": ModelConfig(
        family="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=256, rope_theta=10_000.0,
        rope_scaling=RopeScaling(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=64),
        tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,), pad_token_id=0,
    ),
}


def __getattr__(name: str):
    # The NNX class imports jax, which reading a config.json must not: the web app reads one through this module.
    if name in ("LlamaForCausalLM", "MODEL_CLASS"):
        return model_class(__name__, "LlamaForCausalLM",
                           "Llama 3.x causal language model (see ``CausalLM`` for the call API).")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
