"""Does config.json describe the weights beside it? Checked from the safetensors headers alone (jax-free), before
any model is built.

A config.json that disagrees with its weights was found out only while the model was built and filled: a
``num_hidden_layers`` of a million (or a hidden_size, intermediate_size or vocab_size far off the weights) had
the loader set out to build and allocate that model, and the process was killed for memory before any tensor
was compared. Every door a model directory comes in by (``jaxengine.checkpoint.hf.load_hf_model``: generate,
train, eval, the chat's serve worker, quantizing; ``jaxengine inspect``; base model registration,
``webapp.basemodels.inspection.read_model_facts``) calls ``check_weights_match_config`` first, so all refuse such
a directory in the same words, naming the file, the tensor, both shapes and the config.json field to fix.

The tensors a config implies are listed here from ``ModelConfig`` the way ``models.layers`` builds them (a test
holds the two equal for every family), one layer at a time, so that a config of a million layers costs nothing
before its layer count is compared with the layers the weights hold.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from jaxengine.checkpoint import safetensors_header
from jaxengine.models.config import (FAMILY_WEIGHT_PREFIXES, NESTED_TEXT_CONFIG_FAMILIES, VOCABULARY_ROWS,
                                     ModelConfig, vocab_size_mismatch)

# Mismatches named in one message; the rest are counted.
NAMED_PROBLEMS = 3
# A layer index of more digits is no model's (int() of 4,301 of them is a ValueError: a 500 at registration).
MAX_LAYER_INDEX_DIGITS = 9


@dataclass(frozen=True)
class ExpectedTensor:
    """One tensor a config implies: its name after the family's prefix (``lm_head.weight`` has none), its shape
    as stored (Hugging Face layout) and, per dimension, the config.json fields that size it."""

    name: str
    shape: tuple[int, ...]
    sized_by: tuple[str, ...]
    prefixed: bool = True
    projection: bool = False  # a q/k/v/o/gate/up/down kernel, stored as codes and scales in a serving copy


@dataclass(frozen=True, kw_only=True)
class QuantizedLayout:
    """How a quantized serving copy (``jaxengine.quantize``) stores each projection ``[out, in]``: as
    ``<module>.qweight`` codes ``[in, out]`` (``[in / 2, out]`` under int4, two codes a byte) and ``<module>.scales``
    ``[in / group_size, out]`` (one group of ``in`` rows where ``group_size`` is None), as ``description`` (its
    quantization.json) says; every other tensor as a Hugging Face checkpoint stores it."""

    bits: int
    group_size: int | None
    description: Path


def expected_tensors(config: ModelConfig) -> Iterator[ExpectedTensor]:
    """The tensors a checkpoint of ``config`` holds, in loading order (embedding, each layer's, final norm, head)."""
    vocab, hidden, mlp, head_dim = config.vocab_size, config.hidden_size, config.intermediate_size, config.head_dim
    q_width, kv_width = config.num_heads * head_dim, config.num_kv_heads * head_dim
    q_sized = f"num_attention_heads × head_dim = {config.num_heads} × {head_dim}"
    kv_sized = f"num_key_value_heads × head_dim = {config.num_kv_heads} × {head_dim}"
    hidden_sized, mlp_sized = f"hidden_size = {hidden}", f"intermediate_size = {mlp}"
    yield ExpectedTensor("embed_tokens.weight", (vocab, hidden), (f"vocab_size = {vocab}", hidden_sized))
    for layer in range(config.num_layers):
        def tensor(module: str, shape: tuple[int, ...], sized_by: tuple[str, ...], *,
                   projection: bool = False) -> ExpectedTensor:
            return ExpectedTensor(f"layers.{layer}.{module}", shape, sized_by, projection=projection)

        yield tensor("input_layernorm.weight", (hidden,), (hidden_sized,))
        for projection, width, sized in (("q_proj", q_width, q_sized), ("k_proj", kv_width, kv_sized),
                                         ("v_proj", kv_width, kv_sized)):
            yield tensor(f"self_attn.{projection}.weight", (width, hidden), (sized, hidden_sized), projection=True)
            if config.qkv_bias:
                yield tensor(f"self_attn.{projection}.bias", (width,), (sized,))
        yield tensor("self_attn.o_proj.weight", (hidden, q_width), (hidden_sized, q_sized), projection=True)
        if config.o_proj_bias:
            yield tensor("self_attn.o_proj.bias", (hidden,), (hidden_sized,))
        if config.qk_norm:
            yield tensor("self_attn.q_norm.weight", (head_dim,), (f"head_dim = {head_dim}",))
            yield tensor("self_attn.k_norm.weight", (head_dim,), (f"head_dim = {head_dim}",))
        yield tensor("post_attention_layernorm.weight", (hidden,), (hidden_sized,))
        for projection, shape, sized in (("gate_proj", (mlp, hidden), (mlp_sized, hidden_sized)),
                                         ("up_proj", (mlp, hidden), (mlp_sized, hidden_sized)),
                                         ("down_proj", (hidden, mlp), (hidden_sized, mlp_sized))):
            yield tensor(f"mlp.{projection}.weight", shape, sized, projection=True)
            if config.mlp_bias:
                yield tensor(f"mlp.{projection}.bias", shape[:1], sized[:1])
        if config.sandwich_norms:
            yield tensor("pre_feedforward_layernorm.weight", (hidden,), (hidden_sized,))
            yield tensor("post_feedforward_layernorm.weight", (hidden,), (hidden_sized,))
    yield ExpectedTensor("norm.weight", (hidden,), (hidden_sized,))
    if not config.tie_word_embeddings:
        yield ExpectedTensor("lm_head.weight", (vocab, hidden),
                             (f"vocab_size = {vocab}", hidden_sized), prefixed=False)


def _as_stored(tensor: ExpectedTensor, layout: QuantizedLayout | None, error: type[Exception]
               ) -> tuple[ExpectedTensor, ...]:
    """``tensor`` as a checkpoint of ``layout`` stores it: a projection of a serving copy as its codes and scales."""
    if layout is None or not tensor.projection:
        return (tensor,)
    (out_features, in_features), (out_sized, in_sized) = tensor.shape, tensor.sized_by
    group = layout.group_size or in_features
    if in_features % group or (layout.bits == 4 and in_features % 2):
        raise error(f"{layout.description}: group_size {group} (int{layout.bits}) does not divide the input width "
                    f"{in_features} of {tensor.name!r} ({in_sized}); make the serving copy again from the model it "
                    "was made from")
    stem = tensor.name.removesuffix(".weight")
    codes_per_byte = 2 if layout.bits == 4 else 1
    packed = f"{in_sized} / 2, two int4 codes a byte" if codes_per_byte == 2 else in_sized
    return (ExpectedTensor(f"{stem}.qweight", (in_features // codes_per_byte, out_features), (packed, out_sized)),
            ExpectedTensor(f"{stem}.scales", (in_features // group, out_features),
                           (f"{in_sized} / group_size {group}", out_sized)))


def _shape(shape) -> str:
    return "[" + ", ".join(str(size) for size in shape) + "]"


def _implied_by(tensor: ExpectedTensor, config: ModelConfig, field: str) -> str:
    """Which config.json fields made a missing tensor expected, where it is not every model's."""
    if tensor.name == "lm_head.weight":
        return f" ({field}tie_word_embeddings is false)"
    if tensor.name.endswith(".bias"):
        return f" (architecture {config.family}, {field}attention_bias / {field}mlp_bias)"
    if ".q_norm." in tensor.name or ".k_norm." in tensor.name or "_feedforward_layernorm" in tensor.name:
        return f" (architecture {config.family})"
    return ""


def check_weights_match_config(model_dir: str | Path, hf_config: dict, config: ModelConfig, *,
                               error: type[Exception] = ValueError, remedy: str = "use",
                               files: list[Path] | None = None, quantized: QuantizedLayout | None = None) -> None:
    """Raise ``error`` when the safetensors files of ``model_dir`` (``files``, default those the loader reads) do
    not hold exactly the tensors ``config`` (read from ``hf_config``, its config.json) implies, with their shapes:
    a vocab_size that is not the embedding's rows, a num_hidden_layers that is not the layers stored, or the first
    tensors missing or of another shape, each named with its file, both shapes and the fields that size it.
    ``remedy`` ends the message: "set the field, or ``remedy`` the weights this config.json was written for".
    Tensors of other models a checkpoint may carry (a vision tower) and a head beside tied embeddings are let be,
    as the loader lets them be. Reads headers only; a directory without weights is left to its reader's message.
    ``quantized``: the directory is a serving copy of that layout, whose projections are checked as codes and scales
    (``jaxengine.quantize.load_quantized``)."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    files = safetensors_header.checkpoint_files(model_dir, error=error) if files is None else files
    located: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for file in files:
        for name, entry in safetensors_header.read_safetensors_header(file, error=error).items():
            if name != "__metadata__":
                located[name] = (file, tuple(entry["shape"]))
    if not located:
        return
    field = "text_config." if config.family in NESTED_TEXT_CONFIG_FAMILIES and isinstance(
        hf_config.get("text_config"), dict) else ""
    described_by = "config.json" if quantized is None else f"config.json and {quantized.description.name}"
    ending = (", or make the serving copy again from the model it was made from" if quantized is not None
              else f", or {remedy} the weights this config.json was written for")
    for name, (file, shape) in located.items():
        if name.endswith(VOCABULARY_ROWS) and len(shape) == 2 and shape[0] != config.vocab_size:
            raise error(vocab_size_mismatch(config_path, config.vocab_size, name, file, shape[0], remedy=remedy))

    prefixes = FAMILY_WEIGHT_PREFIXES[config.family]
    layer_name = re.compile("^(?:" + "|".join(re.escape(prefix) for prefix in prefixes) + r")layers\.([0-9]+)\.")
    stored_layers: dict[int, str] = {}
    for name in located:
        if (match := layer_name.match(name)) is not None:
            if len(match.group(1)) > MAX_LAYER_INDEX_DIGITS:
                shown = name[:match.start(1) + 6] + "…"
                raise error(f"{located[name][0]}: the tensor {shown!r} is named for layer {match.group(1)[:6]}… "
                            f"({len(match.group(1))} digits), more layers than any model has; the file is corrupt: "
                            "copy or convert the weights again")
            stored_layers.setdefault(int(match.group(1)), name)
    stored = max(stored_layers) + 1 if stored_layers else 0
    if config.num_layers != stored:
        if stored > config.num_layers:
            beyond = min(index for index in stored_layers if index >= config.num_layers)
            name = stored_layers[beyond]
            found = f"{name!r} in {located[name][0]} is layer {beyond}: the weights hold {stored} layers"
        elif stored:
            found = f"the weights hold {stored} layers (the last, layer {stored - 1}, in {located[stored_layers[stored - 1]][0]})"
        else:
            found = f"the weights hold no layer tensors ({prefixes[0]}layers.0.*) in {', '.join(map(str, files))}"
        raise error(f"{config_path}: {field}num_hidden_layers is {config.num_layers}, but {found}; set "
                    f"{field}num_hidden_layers to {stored}{ending}")

    problems = []
    for tensor in (stored for expected in expected_tensors(config) for stored in _as_stored(expected, quantized, error)):
        names = [prefix + tensor.name for prefix in prefixes] if tensor.prefixed else [tensor.name]
        name = next((candidate for candidate in names if candidate in located), None)
        if name is None:
            searched = files[0] if len(files) == 1 else model_dir / safetensors_header.INDEX_FILE
            problems.append(f"{names[0]!r} of shape {_shape(tensor.shape)} is missing from {searched}"
                            + _implied_by(tensor, config, field))
            continue
        file, shape = located[name]
        if shape != tensor.shape:
            if len(shape) == len(tensor.shape):
                sized = [sized for sized, have, want in zip(tensor.sized_by, shape, tensor.shape) if have != want]
            else:
                sized = list(tensor.sized_by)
            problems.append(f"{name!r} in {file} has shape {_shape(shape)} in its header, {_shape(tensor.shape)} "
                            f"from {described_by} ({field}{f', {field}'.join(sized)})")
    if problems:
        more = f"; and {len(problems) - NAMED_PROBLEMS} more" if len(problems) > NAMED_PROBLEMS else ""
        raise error(f"{config_path} does not describe the weights: {'; '.join(problems[:NAMED_PROBLEMS])}{more}; "
                    f"correct the config.json fields named{ending}")
