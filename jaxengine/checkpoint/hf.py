"""Hugging Face checkpoints (config.json + safetensors) in and out of NNX models, without torch.

Parameter paths mirror Hugging Face module names, so the weight-name mapping is a rule:
``layers.3.self_attn.q_proj.kernel`` <-> ``model.layers.3.self_attn.q_proj.weight`` (kernels
transposed: ours are [in, out], theirs [out, in]); embeddings, norm scales and biases keep
their layout; ``lm_head.kernel`` <-> ``lm_head.weight``. Each family module names the
prefixes its checkpoints use (``WEIGHT_PREFIXES``; Gemma 3 multimodal checkpoints nest the
text model deeper).

Loading builds the model abstractly (``nnx.eval_shape``) and fills each parameter straight
from the file, already cast and (with a mesh) already sharded, so no random init and no
full-size copy on one device happen.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from jaxengine.checkpoint import safetensors_header
from jaxengine.checkpoint.safetensors_header import INDEX_FILE, SINGLE_FILE
from jaxengine.checkpoint.weights_check import check_weights_match_config
from jaxengine.models import CausalLM, ModelConfig, build_model, family_module, from_hf_config, to_hf_config
from jaxengine.json_files import read_json_object

# Files that make a saved directory usable by a tokenizer / generation loader.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json", "generation_config.json",
    "chat_template_kwargs.json",
)
DEFAULT_MAX_SHARD_BYTES = 4 * 1024**3
# Our leaf name -> (Hugging Face leaf name, stored transposed).
LEAF_NAMES = {"kernel": ("weight", True), "embedding": ("weight", False), "scale": ("weight", False),
              "bias": ("bias", False)}
DTYPE_NAMES = {jnp.dtype(jnp.float32): "float32", jnp.dtype(jnp.bfloat16): "bfloat16",
               jnp.dtype(jnp.float16): "float16"}


class CheckpointError(ValueError):
    """A checkpoint does not fit the model its config.json describes."""


def hf_weight_name(path: tuple[Any, ...], *, prefix: str = "model.") -> tuple[str, bool]:
    """(Hugging Face tensor name, whether it is stored transposed) for one parameter path."""
    leaf = str(path[-1])
    if leaf not in LEAF_NAMES:
        raise CheckpointError(
            f"parameter {'.'.join(map(str, path))} has no Hugging Face equivalent (leaf {leaf!r}); "
            "merge adapters into the base weights before saving"
        )
    hf_leaf, transposed = LEAF_NAMES[leaf]
    module_path = ".".join(str(part) for part in path[:-1])
    head = "" if path[0] == "lm_head" else prefix
    return f"{head}{module_path}.{hf_leaf}", transposed


def read_weight_map(index_path: Path) -> dict[str, str]:
    """The ``weight_map`` (tensor name -> shard file name) of a ``model.safetensors.index.json``; an index that
    is not JSON or lacks the map is a CheckpointError naming it (``safetensors_header.read_weight_map``, which
    ``jaxengine inspect`` reads it with)."""
    return safetensors_header.read_weight_map(index_path, error=CheckpointError)


class SafetensorsDir:
    """Name -> file lookup over a single-file or index-sharded safetensors checkpoint."""

    def __init__(self, model_dir: Path, stack: contextlib.ExitStack):
        self.model_dir = model_dir
        self._stack = stack
        self._handles: dict[Path, Any] = {}
        index_path = model_dir / INDEX_FILE
        if index_path.exists():
            self.file_for = {name: model_dir / file for name, file in read_weight_map(index_path).items()}
            self.described_as = str(index_path)
        elif (model_dir / SINGLE_FILE).exists():
            handle = self._open(model_dir / SINGLE_FILE)
            self.file_for = {name: model_dir / SINGLE_FILE for name in handle.keys()}
            self.described_as = str(model_dir / SINGLE_FILE)
        else:
            found = sorted(p.name for p in model_dir.iterdir())
            raise CheckpointError(
                f"{model_dir}: no {SINGLE_FILE} or {INDEX_FILE} found (directory holds {found}); "
                "only safetensors checkpoints are loaded — re-save a PyTorch .bin checkpoint with "
                "transformers' save_pretrained(safe_serialization=True)"
            )

    def _open(self, path: Path):
        if path not in self._handles:
            if not path.exists():
                raise safetensors_header.missing_shard(path, error=CheckpointError)
            if not path.is_file():
                raise safetensors_header.not_a_file(path, error=CheckpointError)
            try:
                handle = safe_open(str(path), framework="numpy")
            except SafetensorError as error:  # its message names no file: which of the shards was it?
                raise CheckpointError(f"{path}: cut short or not a safetensors file ({error}); copy or convert "
                                      "the weights again") from None
            self._handles[path] = self._stack.enter_context(handle)
        return self._handles[path]

    def read(self, names: tuple[str, ...]) -> tuple[str, Path, np.ndarray]:
        """(name found, file, array) for the first of ``names`` present in the checkpoint."""
        for name in names:
            if name in self.file_for:
                path = self.file_for[name]
                return name, path, self._open(path).get_tensor(name)
        raise CheckpointError(
            f"tensor {names[0]!r} is missing from the checkpoint {self.described_as}"
            + (f" (also tried {list(names[1:])})" if len(names) > 1 else "")
            + "; the weights do not match config.json (check num_hidden_layers, tie_word_embeddings, family)"
        )


def read_hf_config(model_dir: str | Path) -> tuple[dict[str, Any], ModelConfig]:
    """(raw config.json dict, ModelConfig) of a Hugging Face model directory."""
    config_path = Path(model_dir) / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path}: not found; a Hugging Face model directory needs a config.json")
    hf_config = read_json_object(config_path)
    return hf_config, from_hf_config(hf_config, source=str(config_path))


def write_safetensors(tensors: dict[str, np.ndarray], path: str | Path, *, metadata: dict[str, str]) -> None:
    """``safetensors.numpy.save_file``, with the file readable as the process's umask allows: safetensors
    0.8 writes it 0600, so a web server or teammate running as another user could not read an export."""
    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
    """The process's umask, read without setting it (os.umask would change it for every thread a moment)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def stored_half_dtype(model_dir: str | Path):
    """bfloat16 or float16 when the directory's config.json says its weights are stored so, else None:
    the dtype a model fine-tuned from it is exported in (``jaxengine.job.export_trained``)."""
    hf_config, _ = read_hf_config(model_dir)
    name = hf_config.get("dtype") or hf_config.get("torch_dtype")
    return {"bfloat16": jnp.bfloat16, "float16": jnp.float16}.get(name)


def load_hf_model(model_dir: str | Path, *, param_dtype=jnp.float32, compute_dtype=jnp.float32,
                  mesh: jax.sharding.Mesh | None = None, rules: dict[str, Any] | None = None
                  ) -> tuple[CausalLM, ModelConfig]:
    """Load a Hugging Face model directory (config.json + safetensors) into an NNX model.

    With ``mesh``, every parameter is placed with the sharding its logical axes get under
    ``rules`` (default ``jaxengine.sharding.DEFAULT_RULES``). Raises ``CheckpointError`` for
    a config.json that does not describe the weights (``weights_check.check_weights_match_config``, from the
    headers, before the model is built) or a damaged file, and ``UnsupportedArchitectureError`` for an
    architecture no family implements.
    """
    from jaxengine.sharding import DEFAULT_RULES, logical_to_sharding

    model_dir = Path(model_dir)
    hf_config, config = read_hf_config(model_dir)
    prefixes = family_module(config.family).WEIGHT_PREFIXES
    loaded = []
    with contextlib.ExitStack() as stack:
        checkpoint = SafetensorsDir(model_dir, stack)
        # Before anything is built: a config.json far off its weights (a million layers) had the build run out
        # of memory before a tensor was compared.
        check_weights_match_config(model_dir, hf_config, config, error=CheckpointError)
        abstract_model = nnx.eval_shape(
            lambda: build_model(config, rngs=nnx.Rngs(0), param_dtype=param_dtype, compute_dtype=compute_dtype))
        graphdef, abstract_state = nnx.split(abstract_model)
        for path, variable in nnx.to_flat_state(abstract_state):
            candidates = tuple(dict.fromkeys(hf_weight_name(path, prefix=prefix)[0] for prefix in prefixes))
            _, transposed = hf_weight_name(path)
            _, _, array = checkpoint.read(candidates)  # of the shape the check above found
            if transposed:
                array = array.T
            array = np.ascontiguousarray(array.astype(param_dtype))
            if mesh is None:
                value = jnp.asarray(array)
            else:
                axes = variable.get_metadata().get("logical_axes")
                value = jax.device_put(array, logical_to_sharding(axes, array.shape, mesh, rules or DEFAULT_RULES))
            loaded.append((path, variable.replace(value)))
    model = nnx.merge(graphdef, nnx.from_flat_state(loaded))
    return model, config


def iter_hf_tensors(model: CausalLM, *, prefix: str = "model.") -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, host array in Hugging Face layout) for every parameter of ``model``."""
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name, transposed = hf_weight_name(path, prefix=prefix)
        array = np.asarray(jax.device_get(variable[...]))
        yield name, np.ascontiguousarray(array.T) if transposed else array


def save_hf_model(model: CausalLM, config: ModelConfig, out_dir: str | Path, *, tokenizer: Any = None,
                  source_dir: str | Path | None = None, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                  dtype=None) -> Path:
    """Write ``model`` as a Hugging Face directory that ``transformers`` loads.

    Writes config.json, ``model.safetensors`` (or ``model-XXXXX-of-YYYYY.safetensors`` shards
    plus ``model.safetensors.index.json`` above ``max_shard_bytes``), and the tokenizer:
    ``tokenizer.save(out_dir)`` when given, else the tokenizer/generation files copied from
    ``source_dir``. Parameters keep their dtype, or are written in ``dtype`` when given (rounded to
    nearest). Returns ``out_dir``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if source_dir is not None and tokenizer is None:
        for file_name in TOKENIZER_FILES:
            source = Path(source_dir) / file_name
            if source.exists() and source.resolve() != (out_dir / file_name).resolve():
                shutil.copyfile(source, out_dir / file_name)
    if tokenizer is not None:
        tokenizer.save(out_dir)
    tensors = dict(iter_hf_tensors(model))
    if dtype is not None:
        tensors = {name: array.astype(dtype) for name, array in tensors.items()}
    shards = _split_into_shards(tensors, max_shard_bytes)
    for stale in (out_dir / SINGLE_FILE, out_dir / INDEX_FILE, *out_dir.glob("model-*-of-*.safetensors")):
        stale.unlink(missing_ok=True)
    if len(shards) == 1:
        write_safetensors(shards[0], out_dir / SINGLE_FILE, metadata={"format": "pt"})
    else:
        weight_map = {}
        for number, shard in enumerate(shards, start=1):
            file_name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(shard, out_dir / file_name, metadata={"format": "pt"})
            weight_map.update({name: file_name for name in shard})
        index = {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}, "weight_map": weight_map}
        (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    hf_config = to_hf_config(config)
    written = jnp.dtype(model.param_dtype if dtype is None else dtype)
    hf_config["dtype"] = DTYPE_NAMES.get(written, str(written))
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    return out_dir


def replace_directory(new: Path, target: Path) -> None:
    """Put the complete directory ``new`` at ``target`` (same filesystem), replacing what is there.

    A directory cannot be renamed over a non-empty one, so an earlier copy is first renamed aside and
    deleted after: between the two renames ``target`` is missing (for a serving copy, the chat then serves
    the unquantized model for that moment), never half-written. Used for serving copies and exports."""
    aside = None
    if target.exists():
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.replaced-", dir=target.parent))
        aside.rmdir()
        target.rename(aside)
    try:
        new.rename(target)
    except OSError:
        if aside is not None:
            aside.rename(target)  # the earlier copy serves on
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _split_into_shards(tensors: dict[str, np.ndarray], max_shard_bytes: int) -> list[dict[str, np.ndarray]]:
    """Greedy split in name order; a tensor larger than the limit gets a shard of its own."""
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        array = tensors[name]
        if shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    return shards
