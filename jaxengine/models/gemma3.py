"""Gemma 3 (text): config.json reading/writing, size presets, weight names.

Differences from Llama, all expressed as ModelConfig flags on the shared layers:
- layers alternate sliding-window and global attention (``layer_types``, or every
  ``sliding_window_pattern``-th layer global); sliding layers use their own rotary base
  (``rope_local_base_freq`` / ``rope_parameters.sliding_attention``), global ones
  ``rope_theta`` with optional scaling;
- RMSNorm scales by (1 + w) in float32, on q/k heads too, and each block norms its attention
  and MLP outputs as well as their inputs (four norms per layer);
- embeddings are multiplied by sqrt(hidden_size); scores are scaled by
  ``query_pre_attn_scalar ** -0.5``; the MLP uses tanh-approximated GELU.

A ``Gemma3ForConditionalGeneration`` (multimodal) checkpoint loads as its text model: the
config's ``text_config`` is read and the vision tower's tensors are ignored.
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
    rope_from_hf,
    rope_to_hf,
)

ARCHITECTURES = FAMILY_ARCHITECTURES["gemma3"]
MODEL_TYPES = FAMILY_MODEL_TYPES["gemma3"]
# Text-only checkpoints, transformers 5 multimodal ones, transformers 4 multimodal ones.
WEIGHT_PREFIXES = FAMILY_WEIGHT_PREFIXES["gemma3"]
# Gemma3TextConfig's defaults: multimodal configs omit text_config fields that equal them.
TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "sliding_window_pattern": 6, "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
}


def _text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The text model's fields, with Gemma3TextConfig defaults filled in."""
    if "text_config" in hf:
        text = dict(hf["text_config"] or {})
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if key not in text and hf.get(key) is not None:
                text[key] = hf[key]
    else:
        text = dict(hf)
    return {**TEXT_DEFAULTS, **{k: v for k, v in text.items() if v is not None or k.endswith("softcapping")}}


def _ropes(text: dict[str, Any]) -> tuple[float, RopeScaling | None, float]:
    """(global theta, global scaling, local theta) from either config.json layout."""
    nested = text.get("rope_parameters") or {}
    if "full_attention" in nested or "sliding_attention" in nested:
        global_theta, scaling = rope_from_hf(nested.get("full_attention"), field="rope_parameters.full_attention")
        local_theta, local_scaling = rope_from_hf(nested.get("sliding_attention"),
                                                  field="rope_parameters.sliding_attention")
        if local_scaling is not None:
            raise ValueError("config.json rope_parameters.sliding_attention: scaled local rope is not supported")
    else:
        global_theta, scaling = rope_from_hf(text.get("rope_scaling"), field="rope_scaling")
        local_theta = None
    global_theta = text["rope_theta"] if global_theta is None else global_theta
    local_theta = text["rope_local_base_freq"] if local_theta is None else local_theta
    return float(global_theta), scaling, float(local_theta)


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a Gemma 3 config.json dict (text-only, or multimodal via its text_config)."""
    text = _text_config(hf)
    if text.get("use_bidirectional_attention"):
        raise ValueError("config.json: use_bidirectional_attention=true (EmbeddingGemma) is not supported")
    num_layers = int(text["num_hidden_layers"])
    layer_types = text.get("layer_types")
    if layer_types is None:
        # Some released configs spell it "_sliding_window_pattern" (a private transformers field).
        pattern = int(text.get("_sliding_window_pattern") or text["sliding_window_pattern"])
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    global_theta, scaling, local_theta = _ropes(text)
    return ModelConfig(
        family="gemma3",
        vocab_size=int(text["vocab_size"]),
        hidden_size=int(text["hidden_size"]),
        intermediate_size=int(text["intermediate_size"]),
        num_layers=num_layers,
        num_heads=int(text["num_attention_heads"]),
        num_kv_heads=int(text["num_key_value_heads"]),
        head_dim=int(text["head_dim"]),
        rms_norm_eps=float(text["rms_norm_eps"]),
        max_position_embeddings=int(text["max_position_embeddings"]),
        rope_theta=global_theta,
        rope_scaling=scaling,
        local_rope_theta=local_theta,
        layer_types=tuple(layer_types),
        sliding_window=int(text["sliding_window"]),
        tie_word_embeddings=bool(text["tie_word_embeddings"]),
        hidden_act=text.get("hidden_activation") or text.get("hidden_act"),
        qkv_bias=bool(text.get("attention_bias", False)),
        o_proj_bias=bool(text.get("attention_bias", False)),
        qk_norm=True,
        norm_unit_offset=True,
        sandwich_norms=True,
        scale_embeddings=True,
        query_pre_attn_scalar=float(text["query_pre_attn_scalar"]),
        attn_logit_softcapping=text.get("attn_logit_softcapping"),
        final_logit_softcapping=text.get("final_logit_softcapping"),
        bos_token_id=text.get("bos_token_id"),
        eos_token_ids=eos_ids_from_hf(text.get("eos_token_id")),
        pad_token_id=text.get("pad_token_id"),
    )


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """Gemma 3 text (``Gemma3ForCausalLM``) config.json dict for ``config``."""
    query_pre_attn_scalar = config.query_pre_attn_scalar
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_activation": config.hidden_act,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": {
            "full_attention": rope_to_hf(config.rope_theta, config.rope_scaling),
            "sliding_attention": rope_to_hf(config.local_rope_theta or config.rope_theta, None),
        },
        "layer_types": list(config.layer_types),
        "sliding_window": config.sliding_window,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.qkv_bias,
        "query_pre_attn_scalar": (int(query_pre_attn_scalar) if float(query_pre_attn_scalar).is_integer()
                                  else query_pre_attn_scalar),
        "attn_logit_softcapping": config.attn_logit_softcapping,
        "final_logit_softcapping": config.final_logit_softcapping,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos_ids_to_hf(config.eos_token_ids),
        "pad_token_id": config.pad_token_id,
    }


def _gemma3(**fields) -> ModelConfig:
    num_layers = fields.pop("num_layers")
    return ModelConfig(
        family="gemma3", num_layers=num_layers, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
        local_rope_theta=10_000.0,
        layer_types=tuple("sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(num_layers)),
        hidden_act="gelu_pytorch_tanh", qk_norm=True, norm_unit_offset=True, sandwich_norms=True,
        scale_embeddings=True, tie_word_embeddings=True, bos_token_id=2, eos_token_ids=(1, 106), pad_token_id=0,
        **fields,
    )


PRESETS = {
    "gemma3-270m": _gemma3(vocab_size=262_144, hidden_size=640, intermediate_size=2048, num_layers=18, num_heads=4,
                           num_kv_heads=1, head_dim=256, query_pre_attn_scalar=256.0, sliding_window=512,
                           max_position_embeddings=32_768),
    "gemma3-1b": _gemma3(vocab_size=262_144, hidden_size=1152, intermediate_size=6912, num_layers=26, num_heads=4,
                         num_kv_heads=1, head_dim=256, query_pre_attn_scalar=256.0, sliding_window=512,
                         max_position_embeddings=32_768),
    "tiny-gemma3": ModelConfig(
        family="gemma3", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=1, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=256, rope_theta=1_000_000.0,
        rope_scaling=RopeScaling(rope_type="linear", factor=2.0), local_rope_theta=10_000.0,
        layer_types=("sliding_attention", "full_attention"), sliding_window=4, hidden_act="gelu_pytorch_tanh",
        qk_norm=True, norm_unit_offset=True, sandwich_norms=True, scale_embeddings=True, query_pre_attn_scalar=24.0,
        tie_word_embeddings=True, bos_token_id=2, eos_token_ids=(1,), pad_token_id=0,
    ),
}


def __getattr__(name: str):
    # The NNX class imports jax, which reading a config.json must not: the web app reads one through this module.
    if name in ("Gemma3ForCausalLM", "MODEL_CLASS"):
        return model_class(__name__, "Gemma3ForCausalLM",
                           "Gemma 3 text causal language model (see ``CausalLM`` for the call API).")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
