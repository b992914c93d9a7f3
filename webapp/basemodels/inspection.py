"""Reading a Hugging Face-format model directory without loading it (jax-free).

Registration must be instant and safe on a web worker, even for a 70B model: we
read ``config.json``, the JSON header of each safetensors file (an 8-byte
little-endian length, then that many bytes of JSON naming every tensor's dtype and
shape) and the tokenizer (for its number of ids). Tensor data is never read.

Paths come from users, so ``resolve_model_dir`` confines them to the allow-listed
models root: ``..`` components are refused outright and symlinks are resolved
before the containment check, so a link pointing outside the root is refused too
(every path outside the root, existing or not, gets the same message);
``read_model_facts`` checks every file it reads the same way (a config.json linked to
a file outside the root was read, and shown on the model's page).

The root is shared by every project, so it is also split between them: a directory under
``projects/<slug>/`` is project ``<slug>``'s alone, and everything else (``shared/``, and any other
top-level directory, as installs laid the root out before projects had folders: the demo at
``demo/``) is every project's. Another project's folder is judged at every component of the
path, as it resolves (a link in a shared directory into it, or a link in it to a shared model,
is refused alike), and refused with the very message a missing directory gets, so that no
project learns what another's folder holds.

The files are untrusted too: every value read from them is checked for its type and
range before use, so a malformed one is a ``ModelDirError`` naming the file and the
field (``"architectures": 5`` was a 500 page).
"""
from __future__ import annotations

import errno
import json
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePath

from jaxengine.chat_template import ChatTemplateError
from jaxengine.checkpoint import safetensors_header
from jaxengine.checkpoint.weights_check import check_weights_match_config
from jaxengine.json_files import UNREADABLE_JSON, json_problem, refuse_values_no_model_holds
from jaxengine.models.config import (NESTED_TEXT_CONFIG_FAMILIES, REQUIRED_CONFIG_FIELDS, VOCABULARY_ROWS,
                                     UnsupportedArchitectureError, family_for_hf_config, from_hf_config,
                                     hf_field_type_problem, vocab_size_mismatch)
from jaxengine.tokenizer import TokenizerError, UnknownEosTokenError, load_tokenizer

# Real config.json files are a few KB (multimodal ones tens of KB); the registry stores and shows it.
MAX_CONFIG_BYTES = 1024 * 1024
# Sizes and counts past this are no model's (and the database's integers end at 2**63).
MAX_COUNT = 2**53
SHARD_INDEX = "model.safetensors.index.json"
# Keys under which Hugging Face configs of the common families state the context length.
CONTEXT_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
# The models root's folders: projects/<slug>/ is that project's own; shared/ (and any other top-level directory) is
# every project's.
PROJECTS_FOLDER = "projects"
SHARED_FOLDER = "shared"
# An uploaded archive is unpacked into a hidden folder of this prefix beside its destination
# (webapp.basemodels.uploads): half-written until it is renamed, it is neither offered nor registered.
UPLOAD_PARTIAL_PREFIX = ".upload-"


class ModelDirError(ValueError):
    """A model directory that cannot be registered; the message says why and what to do."""


@dataclass(frozen=True, kw_only=True)
class ModelFacts:
    """What the registry shows about a model directory."""

    architecture: str  # e.g. "LlamaForCausalLM"
    model_type: str  # e.g. "llama"
    parameter_count: int
    context_length: int | None
    vocab_size: int | None  # config.json's: the rows of the embedding (and output head)
    tokenizer_vocab_size: int | None  # ids the tokenizer has; None when it cannot be read
    tokenizer_type: str  # "tokenizer.json" (Hugging Face tokenizers) or "sentencepiece"
    dtype: str  # the most common tensor dtype in the weights, e.g. "BF16"
    weight_files: tuple[str, ...]
    size_bytes: int
    config: dict


def project_folder(*, models_root: Path, project_slug: str) -> Path:
    """The folder of the models root whose models only project ``project_slug`` sees."""
    return models_root / PROJECTS_FOLDER / project_slug


def in_another_projects_folder(relative: PurePath, *, project_slug: str) -> bool:
    """Whether ``relative`` (a path under the models root) lies in the folder of a project other than
    ``project_slug`` (``projects/<other>/...``): hidden from ``project_slug``'s members."""
    parts = relative.parts
    return len(parts) >= 2 and parts[0] == PROJECTS_FOLDER and parts[1] != project_slug


def _missing(candidate: Path, root: Path, project_slug: str) -> ModelDirError:
    # The one message for a missing directory and for one in another project's folder.
    return ModelDirError(f"{candidate} does not exist; copy the model under {root / SHARED_FOLDER} (every project's) "
                         f"or {project_folder(models_root=root, project_slug=project_slug)} (this project's alone) "
                         "first")


def _resolved(path: Path, *, strict: bool = False) -> Path:
    """``path.resolve()``, a link loop named (Python 3.11 raises RuntimeError, later ones OSError: a server error)."""
    try:
        return path.resolve(strict=strict)
    except RuntimeError as error:
        raise ModelDirError(f"{path}: a link that leads back to itself; replace it with the file or directory") from error
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise ModelDirError(f"{path}: a link that leads back to itself; replace it with the file or directory") from error


def being_unpacked(path: PurePath) -> bool:
    """Whether ``path`` lies in an upload's folder still being unpacked (``UPLOAD_PARTIAL_PREFIX``)."""
    return any(part.startswith(UPLOAD_PARTIAL_PREFIX) for part in path.parts)


def hidden_from_project(path: Path, *, root: Path, project_slug: str) -> bool:
    """Whether ``path`` (absolute) or any directory on its way to it resolves into the folder of a project other
    than ``project_slug`` under ``root`` (resolved)."""
    for prefix in (*reversed(path.parents), path):
        resolved = _resolved(prefix)
        if resolved.is_relative_to(root) and in_another_projects_folder(resolved.relative_to(root),
                                                                         project_slug=project_slug):
            return True
    return False


def refuse_other_projects_folder(path: Path, *, root: Path, project_slug: str) -> None:
    """``ModelDirError``, in the words a missing directory gets, when ``path`` (absolute) or a directory on its way
    to it resolves into the folder of a project other than ``project_slug`` under ``root`` (resolved): registration
    judges a path given by it (``resolve_model_dir``), every load a path stored earlier by it
    (``check_registered_model_dir``)."""
    if hidden_from_project(path, root=root, project_slug=project_slug):
        raise _missing(path, root, project_slug)


def check_registered_model_dir(path: str | Path, *, models_root: Path, project_slug: str) -> None:
    """Refuse (``ModelDirError``, in registration's words) to load the model directory ``path`` for project
    ``project_slug`` when it, a directory on its way to it, or a file linked in it now resolves into another
    project's folder. Every load of a registered model asks this (the web before it sends a model to a worker, the
    worker before it reads one): a registration made before the root was split between projects, or a link
    swapped since, kept its stored path, and loading it read another project's model. Only the folder rule is
    judged here: a directory gone is told by each load in its own words, and a path outside the root (a run's
    export, under the data directory) has no project folder on its way."""
    root = models_root.resolve()
    model_dir = Path(path)
    try:
        refuse_other_projects_folder(model_dir, root=root, project_slug=project_slug)
    except ModelDirError as error:
        raise ModelDirError(f"{error}, and register it again from there (a registration keeps the path it was "
                            "made with)") from None
    try:
        entries = list(os.scandir(model_dir))
    except OSError:  # missing, or not a directory: the load says so
        return
    for entry in entries:
        # The engine reads the directory's own files (config, weights, tokenizer); DirEntry.is_symlink costs no stat.
        if entry.is_symlink():
            resolved = _resolved(Path(entry.path))
            if resolved.is_relative_to(root) and in_another_projects_folder(resolved.relative_to(root),
                                                                            project_slug=project_slug):
                raise _linked_into_another_project(Path(entry.path), root, project_slug)


def resolve_model_dir(raw_path: str, *, models_root: Path, project_slug: str) -> Path:
    """Resolve ``raw_path`` (absolute, or relative to ``models_root``) to a real
    directory inside ``models_root`` that project ``project_slug`` may read (not in another
    project's folder), or raise ``ModelDirError``."""
    raw_path = raw_path.strip()
    if not raw_path:
        raise ModelDirError(f"give a directory under {models_root}")
    if ".." in PurePath(raw_path).parts:
        raise ModelDirError(f"{raw_path!r} contains '..'; give the directory's path under {models_root} directly")
    root = models_root.resolve()
    candidate = Path(raw_path).expanduser()
    if not candidate.is_absolute():
        candidate = root / candidate
    # Judged before existence, on the path as it would resolve (a missing path is judged as if it existed),
    # and with one message that shows only what was given: the form must not say whether a path outside
    # the root, or in another project's folder, exists, nor where a link points. Another project's folder
    # first: a link of its own out of the root would otherwise be told apart from a missing directory.
    refuse_other_projects_folder(candidate, root=root, project_slug=project_slug)
    outside = ModelDirError(f"{candidate}: not a directory under the models root {root}; copy or move the model "
                            "under the root (symlinks there may not point outside it)")
    if not _resolved(candidate).is_relative_to(root):
        raise outside
    if not candidate.exists():
        raise _missing(candidate, root, project_slug)
    resolved = _resolved(candidate, strict=True)
    if not resolved.is_relative_to(root):  # a link changed since the check above
        raise outside
    if in_another_projects_folder(resolved.relative_to(root), project_slug=project_slug):  # likewise
        raise _missing(candidate, root, project_slug)
    if not resolved.is_dir():
        raise ModelDirError(f"{resolved} is a file; give the model's directory (the one holding config.json)")
    if being_unpacked(resolved.relative_to(root)):
        raise ModelDirError(f"{candidate} is an uploaded archive still being unpacked; when it is done it is "
                            "registered under the name it was uploaded with")
    return resolved


def read_safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (``jaxengine.checkpoint.safetensors_header``, the reader
    ``jaxengine inspect`` shares): tensor name -> {dtype, shape, data_offsets}, plus an optional
    ``__metadata__`` entry; a file the loader would refuse is a ``ModelDirError`` naming it."""
    return safetensors_header.read_safetensors_header(path, error=ModelDirError)


def _inside_root(path: Path, models_root: Path, project_slug: str) -> Path:
    """``path`` when it resolves inside ``models_root``, out of other projects' folders; a file linked to one
    outside is refused (where it points is not told when that is another project's folder)."""
    root = models_root.resolve()
    resolved = _resolved(path)
    if not resolved.is_relative_to(root):
        raise ModelDirError(f"{path} links to {resolved}, outside the models root {root}; "
                            "copy the file into the model's directory")
    if in_another_projects_folder(resolved.relative_to(root), project_slug=project_slug):
        raise _linked_into_another_project(path, root, project_slug)
    return path


def _linked_into_another_project(path: Path, root: Path, project_slug: str) -> ModelDirError:
    # Where the link points is not told: it is another project's folder.
    return ModelDirError(f"{path} links out of the folders this project may read ({root / SHARED_FOLDER}, "
                         f"{project_folder(models_root=root, project_slug=project_slug)}); copy the file into the "
                         "model's directory")


def _weight_files(model_dir: Path, models_root: Path, project_slug: str) -> list[Path]:
    index_path = model_dir / SHARD_INDEX
    if index_path.exists():
        _inside_root(index_path, models_root, project_slug)  # its refusal is a ValueError too: not in the try
        try:
            weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        except (*UNREADABLE_JSON, KeyError, TypeError) as exc:
            problem = json_problem(exc) if isinstance(exc, UNREADABLE_JSON) else exc
            raise ModelDirError(f"{index_path}: not a shard index with a 'weight_map' ({problem})") from None
        if not isinstance(weight_map, dict) or not all(isinstance(name, str) for name in weight_map.values()):
            raise ModelDirError(f"{index_path}: 'weight_map' must map each tensor name to its file name")
        names = sorted(set(weight_map.values()))
        files = [_resolved(model_dir / name) for name in names]
        for name, file in zip(names, files):
            if not file.is_relative_to(model_dir):
                raise ModelDirError(f"{index_path}: shard {name!r} lies outside the model directory")
            if not file.is_file():
                raise ModelDirError(f"{index_path}: shard {name!r} is listed but missing")
        return files
    files = [_inside_root(file, models_root, project_slug) for file in sorted(model_dir.glob("*.safetensors"))]
    if not files:
        raise ModelDirError(
            f"{model_dir}: no safetensors weights (model.safetensors or {SHARD_INDEX}); "
            "convert .bin/.pt weights to safetensors first"
        )
    return files


def _count_parameters(files: list[Path]) -> tuple[int, str, list[tuple[str, Path, int]]]:
    """(parameters, most common dtype, (name, file, rows) of each tensor with one row per token id)."""
    parameter_count = 0
    bytes_by_dtype: Counter[str] = Counter()
    vocabulary_rows = []
    for file in files:
        for name, entry in read_safetensors_header(file).items():
            if name == "__metadata__":
                continue
            shape, dtype = entry["shape"], entry["dtype"]  # checked by the reader
            count = math.prod(shape)
            parameter_count += count
            if parameter_count >= MAX_COUNT:
                raise ModelDirError(f"{file}: the tensors' sizes add up to {parameter_count} parameters, more than "
                                    "any model has; the header is corrupt")
            bytes_by_dtype[dtype] += count
            if name.endswith(VOCABULARY_ROWS) and len(shape) == 2:
                vocabulary_rows.append((name, file, shape[0]))
    dtype = bytes_by_dtype.most_common(1)[0][0] if bytes_by_dtype else "unknown"
    return parameter_count, dtype, vocabulary_rows


def _tokenizer_type(model_dir: Path) -> str:
    if (model_dir / "tokenizer.json").is_file():
        return "tokenizer.json"
    if (model_dir / "tokenizer.model").is_file():
        return "sentencepiece"
    raise ModelDirError(f"{model_dir}: no tokenizer (tokenizer.json or sentencepiece tokenizer.model)")


def _tokenizer_vocab_size(model_dir: Path) -> int | None:
    # Embeddings are often padded past the tokenizer's ids (to a multiple of 64 or 128, for the
    # accelerator), so config.json's vocab_size alone does not say how many ids the tokenizer has.
    # A tokenizer that cannot be read (its chat template included) does not block the registration: its runs
    # report why.
    try:
        return load_tokenizer(model_dir).vocab_size
    except UnknownEosTokenError as error:  # readable, but no answer would end: refused now, not at the first chat
        raise ModelDirError(f"{error}, then register it") from None
    except (TokenizerError, ChatTemplateError, OSError):
        return None


def _first_int(config: dict, keys: tuple[str, ...], *, source: Path) -> int | None:
    # Multimodal configs nest the language model's settings under "text_config".
    for part in (config, config.get("text_config") or {}):
        for key in keys:
            value = part.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                if not 0 < value < MAX_COUNT:
                    raise ModelDirError(f"{source}: {key} is {value}; give the model's real value (a positive count)")
                return value
    return None


def _check_config(config: dict, family: str, config_path: Path) -> None:
    """The fields the engine needs to build ``family``'s model, as positive integers: a config lacking
    hidden_size was registered, and the first run on it failed at load."""
    if config.get("text_config") is not None and not isinstance(config["text_config"], dict):
        raise ModelDirError(f"{config_path}: 'text_config' must be a JSON object")
    text = config.get("text_config") or config if family in NESTED_TEXT_CONFIG_FAMILIES else config
    for key in REQUIRED_CONFIG_FIELDS[family]:
        value = text.get(key, config.get(key))
        if value is None:
            raise ModelDirError(f"{config_path}: a {family} model's config needs {key!r}, which is missing")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < MAX_COUNT:
            raise ModelDirError(f"{config_path}: {key} is {value!r}; it must be a positive whole number")
    # Every other field the engine reads, of the JSON type it reads (as jaxengine.models.config.from_hf_config
    # refuses it when a run or a chat loads the model).
    if problem := hf_field_type_problem(config):
        raise ModelDirError(f"{config_path}: {problem}")


def _vocab_size(config: dict, family: str, config_path: Path) -> int | None:
    """config.json's vocab_size as the engine reads it (a multimodal Gemma 3 config's text_config first)."""
    if family in NESTED_TEXT_CONFIG_FAMILIES and isinstance(config.get("text_config"), dict):
        nested = _first_int(config["text_config"], ("vocab_size",), source=config_path)
        if nested is not None:
            return nested
    return _first_int(config, ("vocab_size",), source=config_path)


def read_model_facts(model_dir: Path, *, models_root: Path, project_slug: str) -> ModelFacts:
    """Inspect a resolved model directory (see ``resolve_model_dir``) under ``models_root``, for project
    ``project_slug``: none of the files read may lie in another project's folder."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelDirError(f"{model_dir}: no config.json; is this a Hugging Face-format model directory?")
    _inside_root(config_path, models_root, project_slug)
    if config_path.stat().st_size > MAX_CONFIG_BYTES:
        raise ModelDirError(f"{config_path}: {config_path.stat().st_size} bytes; a config.json is a few KB (at most "
                            f"{MAX_CONFIG_BYTES} here): is it the right file?")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except UNREADABLE_JSON as exc:
        raise ModelDirError(f"{config_path}: not valid JSON ({json_problem(exc)})") from None
    if not isinstance(config, dict):
        raise ModelDirError(f"{config_path}: must hold a JSON object")
    refuse_values_no_model_holds(config, path=config_path, error=ModelDirError)
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(name, str) for name in architectures):
        raise ModelDirError(f"{config_path}: 'architectures' must be a list of class names, e.g. "
                            '["LlamaForCausalLM"]')
    model_type = config.get("model_type") or ""
    if not isinstance(model_type, str):
        raise ModelDirError(f"{config_path}: 'model_type' must be a string, e.g. \"llama\"")
    architecture = architectures[0] if architectures else model_type
    if not architecture:
        raise ModelDirError(f"{config_path}: neither 'architectures' nor 'model_type' is set")
    try:  # refused now rather than when a run or a chat first loads it
        family = family_for_hf_config(config, source=str(config_path))
    except UnsupportedArchitectureError as error:
        raise ModelDirError(f"{error}; register a model of one of these families") from None
    _check_config(config, family, config_path)
    files = _weight_files(model_dir, models_root, project_slug)
    parameter_count, dtype, vocabulary_rows = _count_parameters(files)
    vocab_size = _vocab_size(config, family, config_path)
    for tensor, file, rows in vocabulary_rows:
        if vocab_size is not None and rows != vocab_size:  # refused now, not when a run first loads it
            raise ModelDirError(vocab_size_mismatch(config_path, vocab_size, tensor, file, rows, remedy="register"))
    # The weights, as the loader checks them before it builds the model: a config.json that does not describe them
    # (a million layers, a hidden_size far off) was registered, and the first run or chat on it ran out of memory.
    try:
        model_config = from_hf_config(config, source=str(config_path))
    except (ValueError, TypeError, KeyError) as error:
        raise ModelDirError(f"{config_path}: {error}") from None
    check_weights_match_config(model_dir, config, model_config, error=ModelDirError, remedy="register", files=files)
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir / name).exists():
            _inside_root(model_dir / name, models_root, project_slug)
    return ModelFacts(
        architecture=architecture,
        model_type=model_type,
        parameter_count=parameter_count,
        context_length=_first_int(config, CONTEXT_LENGTH_KEYS, source=config_path),
        vocab_size=vocab_size,
        tokenizer_vocab_size=_tokenizer_vocab_size(model_dir),
        tokenizer_type=_tokenizer_type(model_dir),
        dtype=dtype,
        weight_files=tuple(file.name for file in files),
        size_bytes=sum(file.stat().st_size for file in files),
        config=config,
    )
