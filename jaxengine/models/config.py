"""Model configuration shared by every family, and the doors in from Hugging Face and presets.

One frozen ``ModelConfig`` describes any supported decoder-only model: the families differ
only in flags (q/k norm, qkv bias, Gemma's (1 + w) norm and sandwich norms, embedding
scaling, sliding-window layers, rope variants). Each family module
(``jaxengine/models/<family>.py``) knows how to read and write its Hugging Face
``config.json`` and names its size presets; this module dispatches to them.

This module and the family modules import no jax at module level (a family's NNX class is made on
first use, ``model_class``), so that a jax-free caller (the web app) reads a config.json as the engine does.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import threading
import types
from pathlib import Path
from typing import Any, Literal

LayerType = Literal["full_attention", "sliding_attention"]
LAYER_TYPES = ("full_attention", "sliding_attention")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
ROPE_TYPES = ("llama3", "linear")

# Family name -> module under jaxengine.models. Each module defines ARCHITECTURES, MODEL_TYPES,
# WEIGHT_PREFIXES (its entries below), config_from_hf(dict) -> ModelConfig, config_to_hf(ModelConfig) -> dict,
# PRESETS, and MODEL_CLASS (its named CausalLM subclass, made on first use: ``model_class``).
FAMILY_MODULES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}
# What each family reads: config.json's ``architectures`` entries, and its ``model_type`` when it names
# no architecture. Here rather than in the family modules, which import jax, so that the web app can
# refuse a model no family loads when it is registered.
FAMILY_ARCHITECTURES = {"llama": ("LlamaForCausalLM",), "qwen2": ("Qwen2ForCausalLM",),
                        "qwen3": ("Qwen3ForCausalLM",),
                        "gemma3": ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")}
FAMILY_MODEL_TYPES = {"llama": ("llama",), "qwen2": ("qwen2",), "qwen3": ("qwen3",), "gemma3": ("gemma3_text", "gemma3")}
# The prefixes of the tensor names in each family's checkpoints: "model.<our path>" ("lm_head.weight" for the head);
# Gemma 3 multimodal ones nest the text model deeper (transformers 5, then transformers 4).
FAMILY_WEIGHT_PREFIXES = {"llama": ("model.",), "qwen2": ("model.",), "qwen3": ("model.",),
                          "gemma3": ("model.", "model.language_model.", "language_model.model.")}
# The config.json fields each family cannot do without (its config_from_hf raises without them; Gemma 3
# fills every field from Gemma3TextConfig's defaults), for the web app to check at registration.
_LLAMA_LIKE_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
REQUIRED_CONFIG_FIELDS = {"llama": _LLAMA_LIKE_REQUIRED, "qwen2": _LLAMA_LIKE_REQUIRED, "qwen3": _LLAMA_LIKE_REQUIRED,
                          "gemma3": ()}
NESTED_TEXT_CONFIG_FAMILIES = ("gemma3",)  # whose multimodal config.json holds the text model in text_config

# Tensors with one row per token id: config.json's vocab_size is their row count in every family (Llama,
# Qwen and Gemma pad the embedding past the tokenizer's ids and state the padded size there).
VOCABULARY_ROWS = ("embed_tokens.weight", "lm_head.weight")


def vocab_size_mismatch(config_path, vocab_size: int, tensor: str, file, rows: int, *, remedy: str) -> str:
    """The message for a config.json whose vocab_size is not the rows of ``tensor`` (also the registry's)."""
    return (f"{config_path}: vocab_size is {vocab_size}, but {tensor!r} in {file} has {rows} rows (one per token "
            f"id); set vocab_size to {rows}, or {remedy} the weights this config.json was written for")


class UnsupportedArchitectureError(ValueError):
    """A config.json names an architecture no family here implements."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """Rotary frequency scaling of the Hugging Face ``rope_parameters`` / ``rope_scaling`` kinds.

    ``llama3``: Llama 3.1/3.2 smooth low-frequency interpolation (uses every field).
    ``linear``: every inverse frequency divided by ``factor`` (Gemma 3 4B+ global layers).
    """

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"RopeScaling.rope_type={self.rope_type!r} is not supported; use one of {ROPE_TYPES}")
        if self.factor <= 0:
            raise ValueError(f"RopeScaling.factor must be > 0, got {self.factor}")
        if self.rope_type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"RopeScaling: high_freq_factor ({self.high_freq_factor}) must exceed "
                f"low_freq_factor ({self.low_freq_factor}) for llama3 scaling"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture of a decoder-only language model (any supported family).

    Shape letters used across the engine: B batch, T query length, S key length,
    D ``hidden_size``, N ``num_heads``, K ``num_kv_heads``, H ``head_dim``,
    F ``intermediate_size``, V ``vocab_size``.
    """

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 8192
    # Rotary embedding of full-attention layers, and of sliding layers when local_rope_theta is set.
    rope_theta: float = 10_000.0
    rope_scaling: RopeScaling | None = None
    # Gemma 3: sliding-window layers use their own base and no scaling.
    local_rope_theta: float | None = None
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    # Gemma: norms scale by (1 + w) with w initialised at 0, computed in float32.
    norm_unit_offset: bool = False
    # Gemma: norms after attention and after the MLP as well as before each.
    sandwich_norms: bool = False
    # Gemma: embeddings multiplied by sqrt(hidden_size).
    scale_embeddings: bool = False
    # Attention scores are scaled by query_pre_attn_scalar ** -0.5 when set, else head_dim ** -0.5.
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self):
        if self.family not in FAMILY_MODULES:
            raise ValueError(f"ModelConfig.family={self.family!r} is not supported; use one of {tuple(FAMILY_MODULES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            # a config.json's "num_hidden_layers": "four" failed as "'<=' not supported between 'str' and 'int'"
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"ModelConfig.{name} must be a whole number, got {value!r}")
            if value <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {value}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"ModelConfig.layer_types has {len(self.layer_types)} entries but num_layers={self.num_layers}"
            )
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if unknown:
            raise ValueError(f"ModelConfig.layer_types has unknown entries {unknown}; allowed: {LAYER_TYPES}")
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ValueError("ModelConfig.sliding_window must be set when layer_types has 'sliding_attention'")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"ModelConfig.hidden_act={self.hidden_act!r} is not supported; use one of {ACTIVATIONS}")

    @property
    def attention_scale(self) -> float:
        """Multiplier of q·k scores."""
        scalar = self.query_pre_attn_scalar if self.query_pre_attn_scalar is not None else self.head_dim
        return 1.0 / math.sqrt(scalar)

    @property
    def has_sliding_layers(self) -> bool:
        return "sliding_attention" in self.layer_types

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def family_module(family: str):
    """The module implementing ``family`` (imported on first use; it imports jax)."""
    if family not in FAMILY_MODULES:
        raise ValueError(f"unknown model family {family!r}; supported: {tuple(FAMILY_MODULES)}")
    return importlib.import_module(f"jaxengine.models.{FAMILY_MODULES[family]}")


_MODEL_CLASSES: dict[str, type] = {}
_MODEL_CLASSES_LOCK = threading.Lock()


def model_class(module_name: str, class_name: str, doc: str) -> type:
    """A family's named ``CausalLM`` subclass (``LlamaForCausalLM``, ...), made once, on first use: it imports jax,
    which reading a config.json through the family module must not (the web app reads one at registration).
    One class per name, whichever thread asks first: a model's graph holds its class."""
    with _MODEL_CLASSES_LOCK:
        if class_name not in _MODEL_CLASSES:
            from jaxengine.models.transformer import CausalLM

            def body(namespace: dict) -> None:
                namespace.update(__doc__=doc, __module__=module_name, __qualname__=class_name)

            _MODEL_CLASSES[class_name] = types.new_class(class_name, (CausalLM,), exec_body=body)
        return _MODEL_CLASSES[class_name]


def supported_architectures() -> tuple[str, ...]:
    """Every Hugging Face ``architectures`` entry that some family loads."""
    return tuple(arch for family in FAMILY_MODULES for arch in FAMILY_ARCHITECTURES[family])


def family_for_hf_config(hf_config: dict[str, Any], *, source: str = "config.json") -> str:
    """The family that reads ``hf_config``, chosen by its ``architectures`` then ``model_type`` (jax-free)."""
    architectures = hf_config.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(name, str) for name in architectures):
        # a string was read a letter a class name: "architectures=['L', 'l', 'a', ...] is not supported"
        raise UnsupportedArchitectureError(f"{source}: field 'architectures' = {architectures!r}: expected a list of "
                                           'class names, e.g. ["LlamaForCausalLM"]')
    model_type = hf_config.get("model_type")
    for family in FAMILY_MODULES:
        if any(arch in FAMILY_ARCHITECTURES[family] for arch in architectures):
            return family
    if not architectures:
        for family in FAMILY_MODULES:
            if model_type in FAMILY_MODEL_TYPES[family]:
                return family
    raise UnsupportedArchitectureError(
        f"{source}: architectures={architectures} (model_type={model_type!r}) is not supported; "
        f"supported architectures: {', '.join(supported_architectures())}"
    )


# config.json fields the families read, by the JSON type they must have (when present and not null).
WHOLE_NUMBER_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                       "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window",
                       "max_window_layers", "sliding_window_pattern", "_sliding_window_pattern")
# Sizes among them, which 0 or below would not describe a model (a context of 0 was described as one by inspect).
POSITIVE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "head_dim", "max_position_embeddings")
NUMBER_FIELDS = ("rms_norm_eps", "rope_theta", "rope_local_base_freq", "query_pre_attn_scalar",
                 "attn_logit_softcapping", "final_logit_softcapping")
OBJECT_FIELDS = ("rope_parameters", "rope_scaling", "text_config")
TOKEN_ID_FIELDS = ("bos_token_id", "pad_token_id")
TOKEN_IDS_FIELDS = ("eos_token_id",)  # one id or a list of them
BOOLEAN_FIELDS = ("tie_word_embeddings", "attention_bias")  # bool("false") is true


def _is_whole_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def hf_field_type_problem(hf_config: dict[str, Any], *, prefix: str = "") -> str | None:
    """The first field of ``hf_config`` (and of its ``text_config``) whose JSON type is not the one the families
    read, as ``field 'key' = value: expected ...``; None when all are. Checked before a family reads them:
    "num_hidden_layers": "2" failed there as "can't multiply sequence by non-int of type 'str'" and
    "max_position_embeddings": "x" as "invalid literal for int()", naming no field."""
    for key, value in hf_config.items():
        if value is None:
            continue
        if key in WHOLE_NUMBER_FIELDS and (isinstance(value, bool) or not isinstance(value, int)):
            expected = "a whole number"
        elif key in POSITIVE_FIELDS and value <= 0:
            expected = "a positive whole number"
        elif key in NUMBER_FIELDS and (isinstance(value, bool) or not isinstance(value, (int, float))):
            expected = "a number"
        elif key in OBJECT_FIELDS and not isinstance(value, dict):
            expected = "a JSON object"
        elif key in TOKEN_ID_FIELDS and not _is_whole_number(value):
            expected = "a whole number"
        elif key in TOKEN_IDS_FIELDS and not (_is_whole_number(value) or (
                isinstance(value, list) and all(_is_whole_number(item) for item in value))):
            expected = "a whole number or a list of them"
        elif key in BOOLEAN_FIELDS and not isinstance(value, bool):
            expected = "true or false"
        else:
            continue
        return f"field {prefix + key!r} = {value!r}: expected {expected}"
    text_config = hf_config.get("text_config")
    return hf_field_type_problem(text_config, prefix="text_config.") if isinstance(text_config, dict) else None


def from_hf_config(hf_config: dict[str, Any], *, source: str = "config.json") -> ModelConfig:
    """Read a Hugging Face ``config.json`` dict into a ``ModelConfig``.

    Raises ``UnsupportedArchitectureError`` naming what was found and what is supported, and ValueError
    naming a field of the wrong type.
    """
    family = family_for_hf_config(hf_config, source=source)
    problem = hf_field_type_problem(hf_config)
    if problem is not None:
        raise ValueError(problem)
    return family_module(family).config_from_hf(hf_config)


def to_hf_config(config: ModelConfig) -> dict[str, Any]:
    """A Hugging Face ``config.json`` dict that ``transformers`` loads as this architecture."""
    return family_module(config.family).config_to_hf(config)


def preset_names() -> tuple[str, ...]:
    """Every named preset, e.g. ``llama3.2-1b`` or ``tiny-gemma3``."""
    return tuple(name for family in FAMILY_MODULES for name in family_module(family).PRESETS)


def preset(name: str) -> ModelConfig:
    """The named preset config (real sizes such as ``gemma3-1b``; tiny test sizes ``tiny-<family>``)."""
    for family in FAMILY_MODULES:
        presets = family_module(family).PRESETS
        if name in presets:
            return presets[name]
    raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(preset_names())}")


def rope_from_hf(parameters: dict[str, Any] | None, *, field: str) -> tuple[float | None, RopeScaling | None]:
    """(rope_theta, scaling) from one Hugging Face rope dict (``rope_parameters`` or ``rope_scaling``).

    Accepts both the transformers 5 form (``rope_type``, ``rope_theta`` inside) and the
    older one (``type``). ``default`` means no scaling.
    """
    if not parameters:
        return None, None
    theta = parameters.get("rope_theta")
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"config.json {field}: rope_type={rope_type!r} is not supported; use one of "
                         f"{('default',) + ROPE_TYPES}")
    kwargs = {"rope_type": rope_type, "factor": float(parameters["factor"])}
    for key in ("low_freq_factor", "high_freq_factor"):
        if key in parameters:
            kwargs[key] = float(parameters[key])
    if "original_max_position_embeddings" in parameters:
        kwargs["original_max_position_embeddings"] = int(parameters["original_max_position_embeddings"])
    return theta, RopeScaling(**kwargs)


def rope_to_hf(theta: float, scaling: RopeScaling | None) -> dict[str, Any]:
    """The transformers 5 ``rope_parameters`` dict for one rope."""
    if scaling is None:
        return {"rope_type": "default", "rope_theta": theta}
    out: dict[str, Any] = {"rope_type": scaling.rope_type, "rope_theta": theta, "factor": scaling.factor}
    if scaling.rope_type == "llama3":
        out.update(
            low_freq_factor=scaling.low_freq_factor,
            high_freq_factor=scaling.high_freq_factor,
            original_max_position_embeddings=scaling.original_max_position_embeddings,
        )
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class PositionLimit:
    """The most token positions a model was trained for (or extended to by RoPE scaling), and how its
    config.json says so (``source``, for messages: "max_position_embeddings 2048")."""

    positions: int
    source: str


def position_limit(hf_config: dict[str, Any]) -> PositionLimit | None:
    """The positions ``hf_config`` (a config.json dict, its text model's under ``text_config``) gives a model:
    ``max_position_embeddings``, or the range a RoPE scaling with ``factor`` above 1 extends it to. A scaling
    that names an ``original_max_position_embeddings`` below ``max_position_embeddings`` (Llama 3.1: 8192 and
    131072) says the latter is the extended range already; one that names none or the same (Qwen 2.5's YaRN)
    extends the original by ``factor``. None when the config states no whole number of positions."""
    text = hf_config.get("text_config") if isinstance(hf_config.get("text_config"), dict) else {}
    section = text if "max_position_embeddings" in text else hf_config
    stated = section.get("max_position_embeddings")
    if isinstance(stated, bool) or not isinstance(stated, int) or stated < 1:
        return None
    plain = PositionLimit(positions=stated, source=f"max_position_embeddings {stated}")
    field, scaling = _rope_scaling(section)
    factor = scaling.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 1:
        return plain
    original = scaling.get("original_max_position_embeddings")
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        original = stated
    if original < stated:
        return plain
    named = "max_position_embeddings" if original == stated else "original_max_position_embeddings"
    kind = scaling.get("rope_type", scaling.get("type"))
    return PositionLimit(positions=int(original * factor),
                         source=f"{named} {original} × {field} factor {factor:g}"
                                + (f" ({kind})" if isinstance(kind, str) else ""))


def _rope_scaling(section: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(its key, the rope dict) of the model's full-attention layers, where the families read it: transformers
    5's ``rope_parameters`` (Gemma 3's per layer type), else the older ``rope_scaling``; ``{}`` without one."""
    parameters = section.get("rope_parameters")
    if isinstance(parameters, dict) and parameters:
        if isinstance(parameters.get("full_attention"), dict):
            return "rope_parameters.full_attention", parameters["full_attention"]
        return "rope_parameters", parameters
    scaling = section.get("rope_scaling")
    return "rope_scaling", scaling if isinstance(scaling, dict) else {}


def served_context(hf_config: dict[str, Any]) -> int:
    """The context a model of ``hf_config`` is served with, ``ModelConfig.max_position_embeddings`` as its family
    reads it (its text model's, under ``text_config``; 8192 where unstated), for a jax-free caller: the web app's
    conversation page, which shows the prompt the serve worker fits into it."""
    text = hf_config.get("text_config") if isinstance(hf_config.get("text_config"), dict) else hf_config
    return int(text.get("max_position_embeddings", ModelConfig.max_position_embeddings))


def served_vocab_size(hf_config: dict[str, Any]) -> int | None:
    """The token ids a model of ``hf_config`` takes, ``ModelConfig.vocab_size`` as its family reads it (its text
    model's, under ``text_config``), for a jax-free caller: the web app's ``/v1/completions``, which refuses a prompt
    of token ids past it before the serve worker would. None where config.json states no whole number above 0 there
    (loading the model says what is wrong, and the worker judges the ids)."""
    text = hf_config.get("text_config") if isinstance(hf_config.get("text_config"), dict) else hf_config
    size = text.get("vocab_size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def read_position_limit(model_dir) -> PositionLimit | None:
    """``position_limit`` of the config.json in ``model_dir``; None when it cannot be read as a JSON object
    (loading the model names what is wrong with it)."""
    try:
        hf_config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return position_limit(hf_config) if isinstance(hf_config, dict) else None


def max_seq_len_past_positions(max_seq_len: int, limit: PositionLimit | None) -> str | None:
    """That ``data.max_seq_len`` is past the model's positions (``limit``), and what follows, without what to do;
    None when it is not."""
    if limit is None or max_seq_len <= limit.positions:
        return None
    return (f"{max_seq_len} is past the model's {limit.positions} positions ({limit.source} in its config.json): "
            f"tokens after position {limit.positions} would sit at positions the model was never trained on")


def max_seq_len_problem(max_seq_len: int, limit: PositionLimit | None) -> str | None:
    """Why ``data.max_seq_len`` is past the model's positions (``limit``), to follow the key; None when it
    is not. Training there feeds the model positions it never saw, with no error to say so."""
    if (past := max_seq_len_past_positions(max_seq_len, limit)) is None:
        return None
    return f"{past}; give data.max_seq_len at most {limit.positions}, or choose a model with a longer context"


def eos_ids_from_hf(value: int | list[int] | None) -> tuple[int, ...]:
    """``eos_token_id`` of a config.json (an int, a list or null) as a tuple."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def eos_ids_to_hf(ids: tuple[int, ...]) -> int | list[int] | None:
    if not ids:
        return None
    return ids[0] if len(ids) == 1 else list(ids)


def require(hf_config: dict[str, Any], key: str, *, family: str) -> Any:
    """``hf_config[key]``, or an error naming the missing field."""
    if key not in hf_config or hf_config[key] is None:
        raise ValueError(f"config.json for a {family} model lacks required field {key!r}")
    return hf_config[key]
