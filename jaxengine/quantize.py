"""Quantized serving copies: int8 per output channel (default) or int4 with per-group scales.

Design note. A serving copy is made from a merged model (LoRA already folded in). Every q/k/v/o/
gate/up/down kernel [in, out] is stored as symmetric integer codes with float32 scales; the
embedding, the output head and the norms stay in bfloat16 (the head and embedding are a small share
of a transformer's weights but the most sensitive to rounding, and tied embeddings serve as both).

* ``int8``: one scale per output column over the whole input axis (``group_size`` None):
  ``scale = absmax / 127``, ``code = round(w / scale)`` in [-127, 127].
* ``int4``: one scale per ``group_size`` consecutive input rows per output column:
  ``scale = absmax / 7``, ``code`` in [-7, 7], stored offset by 8 and packed two per byte along the
  input axis (row 2i in the low nibble, 2i + 1 in the high one).

Rounding to the nearest code bounds the error of every weight by half a step:
``|w - scale * code| <= scale / 2`` (tested). ``ServingKernel`` has the same ``dequantize()``
interface as QLoRA's ``QuantizedKernel``, so ``Linear`` dequantizes it inside the jitted matmul and
the full-precision kernel never persists in memory. On CPU, where XLA does not fuse that dequantization,
``load_serving_model`` expands the kernels once instead (``expand_serving_kernels``: the same values).

On disk (``export/quantized/``): ``model.safetensors`` with ``<module>.qweight`` (codes in our
[in, out] layout, int4 packed as above) and ``<module>.scales`` [groups, out] per quantized
projection and the remaining tensors under their Hugging Face names in bfloat16;
``quantization.json`` (the scheme and sizes); ``config.json``; the tokenizer files.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxengine.checkpoint.weights_check import QuantizedLayout, check_weights_match_config
from jaxengine.data.formats import DataSource, Entry
from jaxengine.job import QUANTIZATION_FILE  # jax-free there, for its own check of a model directory
from jaxengine.json_files import read_json_object
from jaxengine.peft.quant import QuantizedWeight
from jaxengine.programs import PROGRAMS

FORMAT_NAME = "temper-quantized"
FORMAT_VERSION = 1
SCHEMES = ("int8", "int4")
DEFAULT_INT4_GROUP_SIZE = 64
_MAX_CODE = {8: 127, 4: 7}
_INT4_OFFSET = 8


class QuantizationError(ValueError):
    """A scheme that does not fit a model, or a directory that is not a quantized serving copy."""


class GroupSizeError(QuantizationError):
    """A group size that does not divide a projection's input width (``group``, ``in_features``)."""

    def __init__(self, *, group: int, in_features: int):
        super().__init__(f"quantize group_size: {group} does not divide a projection's input width {in_features}; "
                         "pick a group size that divides every hidden and intermediate size")
        self.group, self.in_features = group, in_features


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantScheme:
    """``bits`` 8 or 4; ``group_size`` input rows per scale, None = one scale per output channel."""

    bits: int = 8
    group_size: int | None = None

    def __post_init__(self):
        if self.bits not in _MAX_CODE:
            raise QuantizationError(f"quantize bits: {self.bits} is not one of 8, 4")
        if self.group_size is not None and (self.group_size < 2 or self.group_size % 2):
            raise QuantizationError(f"quantize group_size: {self.group_size} must be an even number ≥ 2, or None "
                                    "for one scale per output channel")

    @classmethod
    def named(cls, name: str, *, group_size: int | None = None) -> "QuantScheme":
        """``int8`` (per channel unless ``group_size``) or ``int4`` (groups of ``group_size``, default 64)."""
        if name == "int8":
            return cls(bits=8, group_size=group_size)
        if name == "int4":
            return cls(bits=4, group_size=DEFAULT_INT4_GROUP_SIZE if group_size is None else group_size)
        raise QuantizationError(f"--quantize: {name!r} is not one of {', '.join(SCHEMES)}")

    @property
    def name(self) -> str:
        return f"int{self.bits}"

    def group_for(self, in_features: int) -> int:
        group = in_features if self.group_size is None else self.group_size
        if in_features % group:
            raise GroupSizeError(group=group, in_features=in_features)
        return group


def quantize_kernel(kernel_io: jax.Array, scheme: QuantScheme) -> tuple[jax.Array, jax.Array]:
    """(codes, scales float32 [in / group, out]) of a kernel [in, out].

    Codes are int8 [in, out] for int8, and uint8 [in / 2, out] (two offset nibbles a byte) for int4.
    """
    rows, cols = kernel_io.shape
    group = scheme.group_for(rows)
    max_code = _MAX_CODE[scheme.bits]
    grouped_ggo = kernel_io.astype(jnp.float32).reshape(rows // group, group, cols)  # [G, g, out]
    scales_go = jnp.max(jnp.abs(grouped_ggo), axis=1) / max_code
    safe_go = jnp.where(scales_go > 0, scales_go, 1.0)  # an all-zero group: codes 0, scale 0
    codes_io = jnp.clip(jnp.round(grouped_ggo / safe_go[:, None, :]), -max_code, max_code).reshape(rows, cols)
    if scheme.bits == 8:
        return codes_io.astype(jnp.int8), scales_go
    if rows % 2:
        raise QuantizationError(f"int4 packs two rows a byte; a projection has an odd input width {rows}")
    nibbles_io = (codes_io + _INT4_OFFSET).astype(jnp.uint8)
    return nibbles_io[0::2] | (nibbles_io[1::2] << 4), scales_go


def dequantize_kernel(codes: jax.Array, scales_go: jax.Array, *, bits: int, dtype) -> jax.Array:
    """The kernel [in, out] in ``dtype`` from ``quantize_kernel``'s output."""
    if bits == 8:
        values_io = codes.astype(jnp.float32)
    else:
        low_io, high_io = (codes & 0x0F).astype(jnp.int32), (codes >> 4).astype(jnp.int32)
        values_io = (jnp.stack([low_io, high_io], axis=1).reshape(codes.shape[0] * 2, codes.shape[1])
                     - _INT4_OFFSET).astype(jnp.float32)
    rows, cols = values_io.shape
    groups = scales_go.shape[0]
    grouped_ggo = values_io.reshape(groups, rows // groups, cols) * scales_go[:, None, :]
    return grouped_ggo.reshape(rows, cols).astype(dtype)


class ServingKernel(nnx.Module):
    """A projection kernel [in, out] kept as integer codes and scales; ``dequantize()`` gives it back."""

    def __init__(self, codes: jax.Array, scales_go: jax.Array, *, bits: int, compute_dtype, axes: tuple):
        self.codes = QuantizedWeight(codes)
        self.scales = QuantizedWeight(scales_go)
        self.bits = bits
        self.compute_dtype = compute_dtype
        self.param_dtype = jnp.bfloat16  # what dequantize_model gives back a kernel as
        self.axes = tuple(axes)

    def dequantize(self, dtype=None) -> jax.Array:
        return dequantize_kernel(self.codes[...], self.scales[...], bits=self.bits, dtype=dtype or self.compute_dtype)

    @property
    def nbytes(self) -> int:
        return int(self.codes[...].nbytes + self.scales[...].nbytes)


def _projections(model: nnx.Module):
    from jaxengine.models.layers import Linear
    from jaxengine.peft.lora import PROJECTIONS

    return [(path, linear) for path, linear in nnx.iter_modules(model)
            if isinstance(linear, Linear) and path and path[-1] in PROJECTIONS]


def quantize_for_serving(model: nnx.Module, scheme: QuantScheme) -> dict[str, Any]:
    """Replace every q/k/v/o/gate/up/down kernel of a merged model by a ``ServingKernel``; cast the
    remaining parameters to bfloat16. Returns the sizes (``model_bytes`` of the whole quantized model,
    ``bfloat16_bytes`` of the same model all in bfloat16, and their ratio)."""
    bfloat16_bytes = 2 * sum(int(np.prod(value.shape)) for value in jax.tree.leaves(nnx.state(model, nnx.Param)))
    for _, linear in _projections(model):
        if linear.lora is not None or linear.quantized is not None:
            raise QuantizationError("quantize a merged model: a projection still has a LoRA adapter or QLoRA codes "
                                    "(merge_lora / dequantize_model first, or load the run's export/)")
        codes, scales = quantize_kernel(linear.kernel[...], scheme)
        axes = linear.kernel.get_metadata().get("logical_axes", (None, None))
        linear.quantized = nnx.data(ServingKernel(codes, scales, bits=scheme.bits,
                                                  compute_dtype=linear.compute_dtype, axes=axes))
        del linear.kernel
    nnx.update(model, jax.tree.map(lambda value: value.astype(jnp.bfloat16), nnx.state(model, nnx.Param)))
    return _sizes(model, bfloat16_bytes)


def _sizes(model: nnx.Module, bfloat16_bytes: int) -> dict[str, Any]:
    model_bytes = sum(int(value.nbytes) for value in jax.tree.leaves(nnx.state(model)) if hasattr(value, "nbytes"))
    return {"model_bytes": model_bytes, "bfloat16_bytes": bfloat16_bytes,
            "ratio_to_bfloat16": model_bytes / max(bfloat16_bytes, 1)}


def _tensor_name(path: tuple, suffix: str) -> str:
    from jaxengine.checkpoint.hf import hf_weight_name

    name, _ = hf_weight_name((*path, "kernel"))
    return name.removesuffix(".weight") + suffix


def save_quantized(model: nnx.Module, config, out_dir: str | Path, *, scheme: QuantScheme, tokenizer: Any,
                   sizes: dict[str, Any], extra: dict[str, Any] | None = None) -> Path:
    """Write a model quantized by ``quantize_for_serving`` as a serving copy (see module note)."""
    from jaxengine.checkpoint.hf import SINGLE_FILE, iter_hf_tensors, write_safetensors
    from jaxengine.models import to_hf_config

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = dict(iter_hf_tensors(model))
    modules = []
    for path, linear in _projections(model):
        tensors[_tensor_name(path, ".qweight")] = np.asarray(jax.device_get(linear.quantized.codes[...]))
        tensors[_tensor_name(path, ".scales")] = np.asarray(jax.device_get(linear.quantized.scales[...]))
        modules.append(_tensor_name(path, ""))
    write_safetensors(tensors, out_dir / SINGLE_FILE, metadata={"format": FORMAT_NAME})
    hf_config = to_hf_config(config)
    hf_config["dtype"] = "bfloat16"
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    tokenizer.save(out_dir)
    description = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "scheme": scheme.name, "bits": scheme.bits,
                   "group_size": scheme.group_size, "modules": modules, **sizes, **(extra or {})}
    (out_dir / QUANTIZATION_FILE).write_text(json.dumps(description, indent=2) + "\n")
    return out_dir


def expand_serving_kernels(model: nnx.Module) -> None:
    """Replace every ``ServingKernel`` by its dequantized kernel in the compute dtype, and cast every other
    parameter (stored in bfloat16) to it, once: the very values the model would compute with at each
    step, so it answers the same.

    For CPU serving: XLA's CPU backend fuses neither the dequantization nor the bfloat16 cast into the
    matmul, so each decode step would rebuild every weight in full precision and then read it. Expanded,
    a copy decodes at the unquantized model's speed, with its memory, and still answers as the quantized
    model does."""
    from jaxengine.models.layers import Linear, param

    for _, linear in nnx.iter_modules(model):
        if isinstance(linear, Linear) and isinstance(linear.quantized, ServingKernel):
            kernel = linear.quantized
            linear.kernel = param(kernel.dequantize(), kernel.axes)
            linear.quantized = nnx.data(None)
    compute_dtype = model.compute_dtype
    nnx.update(model, jax.tree.map(lambda value: value.astype(compute_dtype), nnx.state(model, nnx.Param)))


def is_quantized_dir(model_dir: str | Path) -> bool:
    return (Path(model_dir) / QUANTIZATION_FILE).is_file()


def load_quantized(model_dir: str | Path, *, compute_dtype=jnp.bfloat16):
    """(model with ``ServingKernel`` projections, ModelConfig, description dict) of a serving copy."""
    from safetensors import safe_open

    from jaxengine.checkpoint.hf import SINGLE_FILE, hf_weight_name, read_hf_config
    from jaxengine.models import build_model

    model_dir = Path(model_dir)
    description = read_json_object(model_dir / QUANTIZATION_FILE, error=QuantizationError,
                                   advice="export the serving copy again")
    if description.get("format") != FORMAT_NAME or description.get("version") != FORMAT_VERSION:
        raise QuantizationError(f"{model_dir / QUANTIZATION_FILE}: format {description.get('format')!r} version "
                                f"{description.get('version')!r} is not {FORMAT_NAME!r} version {FORMAT_VERSION}; "
                                "export the serving copy again with this version of jaxengine")
    hf_config, config = read_hf_config(model_dir)
    # The codes and scales against config.json from the file's header, as the loader checks a model's weights: a
    # damaged copy (a tensor cut short, a config.json edited) is named here, not a shape error deep in jax.
    layout = quantized_layout(description, model_dir / QUANTIZATION_FILE)
    check_weights_match_config(model_dir, hf_config, config, error=QuantizationError, quantized=layout)
    model = nnx.eval_shape(lambda: build_model(config, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16,
                                               compute_dtype=compute_dtype))
    with contextlib.ExitStack() as stack:
        handle = stack.enter_context(safe_open(str(model_dir / SINGLE_FILE), framework="numpy"))
        names = set(handle.keys())

        def read(name: str) -> np.ndarray:
            if name not in names:
                raise QuantizationError(f"{model_dir / SINGLE_FILE}: tensor {name!r} is missing; the file does not "
                                        f"match config.json and {QUANTIZATION_FILE}")
            return handle.get_tensor(name)

        for path, linear in _projections(model):
            axes = linear.kernel.get_metadata().get("logical_axes", (None, None))
            linear.quantized = nnx.data(ServingKernel(
                jnp.asarray(read(_tensor_name(path, ".qweight"))), jnp.asarray(read(_tensor_name(path, ".scales"))),
                bits=layout.bits, compute_dtype=compute_dtype, axes=axes))
            del linear.kernel
        graphdef, state = nnx.split(model)
        filled = []
        for path, variable in nnx.to_flat_state(state):
            if isinstance(variable, nnx.Param):
                name, transposed = hf_weight_name(path)
                array = read(name)
                variable = variable.replace(jnp.asarray(array.T if transposed else array, jnp.bfloat16))
            filled.append((path, variable))
    return nnx.merge(graphdef, nnx.from_flat_state(filled)), config, description


def quantized_layout(description: dict, path: Path) -> QuantizedLayout:
    """The bits and group size of a serving copy's ``description`` (its quantization.json at ``path``), checked as
    ``QuantScheme`` checks a scheme."""
    bits, group_size = description.get("bits"), description.get("group_size")
    if not (isinstance(bits, int) and (group_size is None or isinstance(group_size, int))):
        raise QuantizationError(f"{path}: bits {bits!r} and group_size {group_size!r} must be whole numbers (group_size "
                                "may be null); export the serving copy again")
    try:
        QuantScheme(bits=bits, group_size=group_size)
    except QuantizationError as error:
        raise QuantizationError(f"{path}: {error}; export the serving copy again") from None
    return QuantizedLayout(bits=bits, group_size=group_size, description=path)


def token_nll(model: nnx.Module, sequences: Sequence[Sequence[int]], *,
              scored: Sequence[Sequence[bool]] | None = None, batch_size: int = 16) -> tuple[float, int]:
    """(summed negative log-likelihood, token count) of the scored tokens of ``sequences``.

    ``scored[i][t]`` says whether token t of sequence i counts (e.g. completion tokens only); by
    default every token after the first. Rows are right-padded: under the causal mask real tokens
    never see the padding. Its compiled programs are dropped when it returns (``_ScoringPrograms``).
    """
    total, count = 0.0, 0
    masks = scored if scored is not None else [[index > 0 for index in range(len(row))] for row in sequences]
    pairs = [(list(row), list(mask)) for row, mask in zip(sequences, masks) if len(row) > 1]
    programs, state = _scoring_programs(model)
    try:
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start:start + batch_size]
            length = max(len(row) for row, _ in chunk)
            ids_bt = np.zeros((len(chunk), length), np.int32)
            mask_bt = np.zeros((len(chunk), length), np.float32)  # [B, T] scored target tokens
            for index, (row, mask) in enumerate(chunk):
                ids_bt[index, :len(row)] = row
                mask_bt[index, 1:len(row)] = np.asarray(mask[1:], np.float32)
            batch_total, batch_count = programs.batch_nll(state, ids_bt, mask_bt)
            total += float(batch_total)
            count += int(batch_count)
    finally:
        PROGRAMS.forget(programs, retire=False)
    return total, count


class _ScoringPrograms:
    """The jitted scoring of one model structure, held in ``jaxengine.programs.PROGRAMS`` for the call using them
    and dropped when it returns: scoring is a serving copy's one-off, and jits at module level, keyed on the model's
    graph, kept the programs of every structure a long-lived serve worker had quantized (``quantize_run``,
    ``make_serving_copy``), each with memory maps of its own, for its life."""

    def __init__(self, graphdef):
        self.graphdef = graphdef
        self.batch_nll = jax.jit(self._batch_nll)
        self.argmax_tokens = jax.jit(self._argmax_tokens)

    def _logits(self, state, ids_bt):
        positions_bt = jnp.broadcast_to(jnp.arange(ids_bt.shape[1]), ids_bt.shape)
        logits_btv, _ = nnx.merge(self.graphdef, state)(ids_bt, positions_bt)
        return logits_btv

    def _batch_nll(self, state, ids_bt, mask_bt):
        logprobs_btv = jax.nn.log_softmax(self._logits(state, ids_bt)[:, :-1], axis=-1)
        target_logprob_bt = jnp.take_along_axis(logprobs_btv, ids_bt[:, 1:, None], axis=-1)[..., 0]
        return -jnp.sum(target_logprob_bt * mask_bt[:, 1:]), jnp.sum(mask_bt[:, 1:])

    def _argmax_tokens(self, state, ids_bt):
        return jnp.argmax(self._logits(state, ids_bt), axis=-1)


def _scoring_programs(model: nnx.Module) -> tuple[_ScoringPrograms, nnx.State]:
    graphdef, state = nnx.split(model)
    return PROGRAMS.get(("scoring", graphdef), lambda: _ScoringPrograms(graphdef)), state


def perplexity(model: nnx.Module, sequences: Sequence[Sequence[int]], *,
               scored: Sequence[Sequence[bool]] | None = None) -> float:
    """exp(mean negative log-likelihood) of the scored tokens (``token_nll``) of ``sequences``."""
    total, count = token_nll(model, sequences, scored=scored)
    if not count:
        raise QuantizationError("perplexity needs at least one sequence of two or more tokens")
    return math.exp(total / count)


def greedy_agreement(reference: nnx.Module, candidate: nnx.Module, tokenizer, prompts: Sequence[Sequence[int]], *,
                     max_new_tokens: int = 32) -> float:
    """Share of the reference's greedy tokens that the candidate also picks greedily.

    The reference's greedy continuation of each prompt is fed to both models (teacher forcing), and a
    position agrees when the candidate's argmax is the reference's token. This counts each
    disagreement once, where free-running decoding would also count everything after it. Its compiled
    programs (the reference's generation, the candidate's argmax) are dropped when it returns.
    """
    from jaxengine.sampler import Sampler, SamplingParams

    sampler = Sampler(reference, tokenizer)
    try:
        generations = sampler.generate(
            [list(prompt) for prompt in prompts], SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
    finally:  # its programs go with this call, as the scoring's (``_ScoringPrograms``)
        sampler.forget_programs(retire=False)
    programs, state = _scoring_programs(candidate)
    agreed, total = 0, 0
    try:
        for prompt, generation in zip(prompts, generations):
            if not generation.token_ids:
                continue
            ids_t = np.asarray([*prompt, *generation.token_ids], np.int32)[None]
            first = len(prompt) - 1  # the logits at this position predict the first generated token
            picked_t = np.asarray(programs.argmax_tokens(state, ids_t))[0, first:first + len(generation.token_ids)]
            agreed += int(np.sum(picked_t == np.asarray(generation.token_ids)))
            total += len(generation.token_ids)
    finally:
        PROGRAMS.forget(programs, retire=False)
    return agreed / max(total, 1)


def eval_token_sets(tokenizer, rows: Sequence[dict], *, kind: str, max_seq_len: int = 512
                    ) -> tuple[list[list[int]], list[list[bool]], list[list[int]]]:
    """(sequences, their scored tokens, prompts) from eval rows of ``kind``, scored as training scores them.

    ``sft`` rows: the rendered prompt + completion (or conversation), scored on the completion /
    assistant tokens, and the prompts of rows that have one. ``prompts`` rows: the rendered prompt +
    ``answer`` + EOS (scored on answer and EOS) where an answer is given, and every prompt.
    ``text`` rows: their windows, scored on every token, and no prompts.
    """
    from jaxengine.data.pipeline import encode_prompt, encode_rows

    if kind in ("sft", "text"):
        examples, _ = encode_rows(rows, task="sft" if kind == "sft" else "pretrain", tokenizer=tokenizer,
                                  max_seq_len=max_seq_len)
        prompts = ([encode_prompt(tokenizer, row["prompt"]) for row in rows if row.get("prompt") is not None]
                   if kind == "sft" else [])
        return ([example.ids.tolist() for example in examples], [example.loss_mask.tolist() for example in examples],
                prompts)
    if kind == "prompts":
        prompts = [encode_prompt(tokenizer, row["prompt"]) for row in rows]
        sequences, scored = [], []
        for prompt, row in zip(prompts, rows):
            if row.get("answer") is None:
                continue
            answer = tokenizer.encode(str(row["answer"])) + list(tokenizer.eos_ids[:1])
            sequences.append((prompt + answer)[:max_seq_len])
            scored.append(([False] * len(prompt) + [True] * len(answer))[:max_seq_len])
        return sequences, scored, prompts
    raise QuantizationError(f"eval data of kind {kind!r} cannot score a quantized copy; give text, sft or prompts rows")


def export_quantized(model_dir: str | Path, out_dir: str | Path, *, scheme: QuantScheme,
                     eval_rows: Sequence[dict] = (), eval_kind: str = "sft", max_new_tokens: int = 32
                     ) -> dict[str, Any]:
    """Quantize the merged Hugging Face model in ``model_dir`` into the serving copy ``out_dir``.

    With ``eval_rows`` the copy is scored against the unquantized model (float32): perplexity of
    both on the rows' completion tokens (``eval_token_sets``), its relative increase, and
    ``greedy_agreement`` on the rows' prompts. Returns the description written to ``quantization.json`` (sizes and figures).

    The copy is written into a new directory beside ``out_dir`` and renamed into place when whole
    (``jaxengine.checkpoint.hf.replace_directory``): a server that finds ``out_dir`` finds a complete copy, and a failure
    leaves whatever was there before (nothing, or an earlier copy) as it was.
    """
    from jaxengine.checkpoint.hf import load_hf_model, replace_directory
    from jaxengine.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    reference, config = load_hf_model(model_dir)
    # A second module tree over the same arrays, without a second copy of the weights in memory:
    # quantizing it replaces its kernels by codes and casts its other parameters, leaving the
    # reference whole. Its Variables must be new ones (the tree.map), since nnx.merge of a split
    # reuses the Variable objects, and the cast updates them in place.
    graphdef, state = nnx.split(reference)
    quantized = nnx.merge(graphdef, jax.tree.map(lambda array: array, state))
    sizes = quantize_for_serving(quantized, scheme)
    figures: dict[str, Any] = {}
    if eval_rows:
        sequences, scored, prompts = eval_token_sets(tokenizer, eval_rows, kind=eval_kind)
        if sequences:
            reference_ppl = perplexity(reference, sequences, scored=scored)
            quantized_ppl = perplexity(quantized, sequences, scored=scored)
            figures.update(eval_sequences=len(sequences), perplexity_reference=reference_ppl,
                           perplexity_quantized=quantized_ppl,
                           perplexity_increase=quantized_ppl / reference_ppl - 1.0)
        if prompts:
            figures.update(eval_prompts=len(prompts), greedy_agreement=greedy_agreement(
                reference, quantized, tokenizer, prompts, max_new_tokens=max_new_tokens))
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.writing-", dir=out_dir.parent))
    try:
        save_quantized(quantized, config, staging, scheme=scheme, tokenizer=tokenizer, sizes=sizes,
                       extra={"source": str(model_dir), **figures})
        replace_directory(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already once renamed into place
    return json.loads((out_dir / QUANTIZATION_FILE).read_text())


# The kind of data each task's eval file holds (``jaxengine.data.pipeline.TASK_KINDS``, by name here).
_SCORED_AS = {"text": "text", "sft": "sft", "preference": "sft", "prompts": "prompts"}


def scoring_rows(rows: Sequence[dict], *, data_kind: str, limit: int = 64) -> tuple[list[dict], str]:
    """(rows, ``eval_kind`` for ``export_quantized``) from up to ``limit`` rows of a dataset of ``data_kind``
    (text, sft, preference, prompts): preference rows are scored by their chosen answers, prompts rows by
    their reference answers."""
    if data_kind not in _SCORED_AS:
        raise QuantizationError(f"eval data of kind {data_kind!r} cannot score a serving copy; "
                                f"give one of {', '.join(_SCORED_AS)}")
    rows = list(rows)[:limit]
    if data_kind == "preference":
        rows = [{"prompt": row["prompt"], "completion": row["chosen"]} for row in rows
                if row.get("prompt") is not None and isinstance(row.get("chosen"), str)]
    return rows, _SCORED_AS[data_kind]


def quantize_model_dir(model_dir: str | Path, out_dir: str | Path, *, scheme_name: str = "int8",
                       group_size: int | None = None, eval_path: str | Path | None = None,
                       eval_data_kind: str = "sft", eval_columns: dict[str, str] | None = None,
                       eval_limit: int = 64, eval_source: DataSource | None = None) -> dict[str, Any]:
    """The serving copy ``out_dir`` of any merged model directory (a base model, an exported checkpoint),
    scored on up to ``eval_limit`` rows of the dataset file ``eval_path`` of ``eval_data_kind`` (none:
    memory only); ``eval_source``: where that file was chosen, whose settings a problem in it names
    (``pipeline.read_examples``; the web app's serve worker gives the launch form's)."""
    from jaxengine.data.pipeline import read_examples

    rows, eval_kind = [], "sft"
    if eval_path is not None and eval_limit:
        read = read_examples(eval_path, kind=eval_data_kind, columns=eval_columns, source=eval_source)
        rows, eval_kind = scoring_rows(itertools.islice(read, eval_limit), data_kind=eval_data_kind, limit=eval_limit)
    return export_quantized(model_dir, out_dir, scheme=QuantScheme.named(scheme_name, group_size=group_size),
                            eval_rows=rows, eval_kind=eval_kind)


def quantize_run_export(run_dir: str | Path, *, scheme_name: str = "int8", group_size: int | None = None,
                        eval_limit: int = 64, model_dir: str | Path | None = None,
                        entry: Entry = Entry.SPEC) -> dict[str, Any]:
    """Write ``<model_dir>/quantized/`` from a run's merged model ``model_dir`` (default its final
    ``export/``; an exported checkpoint's ``export-step-N/`` too), its figures added to that model's card, scored
    on up to ``eval_limit`` rows of the run's ``data.eval`` (preference rows by their chosen answers; RL tasks' prompts by their
    reference answers). ``entry``: where the run's spec came from, whose settings a problem in its eval data names,
    as its training named them (``job.run_job``): a job spec's keys (``jaxengine export``), or the launch form's
    (``Entry.LAUNCH``: the web app's workers, for a run launched there)."""
    from jaxengine.job import JobError, _read_eval_rows
    from jaxengine.model_card import note_serving_copy
    from jaxengine.spec import TASK_DATASET_KINDS, load_spec

    run_dir = Path(run_dir)
    model_dir = run_dir / "export" if model_dir is None else Path(model_dir)
    spec = load_spec(run_dir / "spec.yaml")
    rows, eval_kind = [], "sft"
    if spec.data.eval and eval_limit:
        if not Path(spec.data.eval).is_file():  # moved since the run: it was a FileNotFoundError traceback
            problem = "is a directory, not a file" if Path(spec.data.eval).is_dir() else "no such file"
            if entry is Entry.SPEC:
                raise JobError(f"data.eval: {spec.data.eval} (in {run_dir / 'spec.yaml'}): {problem}; the quantized "
                               "copy is scored on its rows: put it back, or give --eval-limit 0 to write the copy "
                               "unscored")
            # The web's: the run's held-out version, named by reporting.in_project_terms while it exists.
            raise JobError(f"data.eval: {spec.data.eval}: {problem} (its dataset version deleted since the run?); the "
                           "quantized copy is scored on its rows")
        rows, eval_kind = scoring_rows(_read_eval_rows(spec.data.eval, spec.task, spec.data.columns, entry=entry),
                                       data_kind=TASK_DATASET_KINDS.get(spec.task, "prompts"), limit=eval_limit)
    description = export_quantized(model_dir, model_dir / "quantized",
                                   scheme=QuantScheme.named(scheme_name, group_size=group_size), eval_rows=rows,
                                   eval_kind=eval_kind)
    note_serving_copy(model_dir, description)
    return description
