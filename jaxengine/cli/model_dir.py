"""Shared by ``jaxengine inspect`` and ``jaxengine generate``: checking a model directory before any
heavy import, reading safetensors headers, and turning known errors into one-line messages (exit 2)."""
from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Callable
from pathlib import Path

from jaxengine.json_files import read_json_object

EXIT_BAD_INPUT = 2


class CliError(Exception):
    """Bad input the user can fix; printed as one line, exit code 2."""


def checked_model_dir(value: str) -> Path:
    """``value`` as a directory that holds a readable config.json, or CliError saying what is missing."""
    model_dir = Path(value)
    if not model_dir.exists():
        raise CliError(f"--model {value}: no such directory")
    if not model_dir.is_dir():
        raise CliError(f"--model {value}: not a directory; give the directory holding config.json")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise CliError(f"--model {value}: no config.json; a Hugging Face model directory needs one")
    read_json_object(config_path, error=CliError)
    return model_dir


def read_model_config(model_dir: Path):
    """(config.json dict, ModelConfig); a config that lacks or misstates a field is a CliError."""
    from jaxengine.checkpoint.hf import read_hf_config
    from jaxengine.models.config import UnsupportedArchitectureError

    try:
        return read_hf_config(model_dir)
    except UnsupportedArchitectureError:
        raise
    except (ValueError, TypeError, KeyError) as error:  # a missing or ill-typed field of config.json
        raise CliError(f"{model_dir / 'config.json'}: {error}") from None


# A header larger than this is a corrupt length field, not a header (the biggest real ones are a few MB).
MAX_HEADER_BYTES = 100 * 2**20


def read_safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (tensor name -> dtype, shape, offsets), without reading any
    tensor; a file too short or not of that form is a CliError naming it."""
    with path.open("rb") as handle:
        prefix = handle.read(8)
        header_size = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None
        raw = handle.read(header_size) if header_size is not None and header_size <= MAX_HEADER_BYTES else b""
    if header_size is None or len(raw) != header_size:
        raise CliError(f"{path}: cut short or not a safetensors file (its header cannot be read); "
                       "copy or convert the weights again")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict) or not all(
            name == "__metadata__" or (isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
                                       and isinstance(entry.get("shape"), list)
                                       and all(isinstance(size, int) and size >= 0 for size in entry["shape"]))
            for name, entry in (header or {}).items()):
        raise CliError(f"{path}: the safetensors header is not a JSON object of tensors (dtype and shape); "
                       "the file is corrupt")
    # The header alone reads fine from a copy that stopped after it; the tensors' end offsets say how long
    # the whole file is, so a file cut short is named here, as generate and train refuse it.
    described = 8 + header_size + max((entry["data_offsets"][1] for name, entry in header.items()
                                       if name != "__metadata__" and _offsets(entry)), default=0)
    size = path.stat().st_size
    if size < described:
        raise CliError(f"{path}: cut short: its header describes {described:,} bytes, the file holds {size:,}; "
                       "copy or convert the weights again")
    return header


def _offsets(entry: dict) -> bool:
    """Whether a header entry has the [begin, end] byte offsets of its tensor."""
    offsets = entry.get("data_offsets")
    return (isinstance(offsets, list) and len(offsets) == 2
            and all(isinstance(offset, int) and not isinstance(offset, bool) for offset in offsets))


def safetensors_summary(model_dir: Path) -> dict:
    """Files, tensor count, element count, dtypes and parameter count of the ``*.safetensors`` files, from
    their headers only. The parameters are the model's weights as stored, so a config.json that does not
    describe them is not believed; in a quantized serving copy (``jaxengine.quantize``) each ``.qweight`` of
    codes counts as the weights it stands for (two per byte under int4) and its ``.scales`` not at all."""
    from jaxengine.job import QUANTIZATION_FILE

    quantization = model_dir / QUANTIZATION_FILE
    bits = None
    if quantization.is_file():
        bits = read_json_object(quantization, error=CliError, advice="export the serving copy again").get("bits")
    files = sorted(model_dir.glob("*.safetensors"))
    tensors, elements, parameters, dtypes = 0, 0, 0, set()
    for path in files:
        for name, entry in read_safetensors_header(path).items():
            if name == "__metadata__":
                continue
            tensors += 1
            count = math.prod(entry["shape"])
            elements += count
            dtypes.add(entry["dtype"])
            if bits is not None and name.endswith(".scales"):
                continue
            parameters += count * 2 if bits == 4 and name.endswith(".qweight") else count
    return {"files": len(files), "tensors": tensors, "elements": elements, "parameters": parameters,
            "dtypes": sorted(dtypes)}


def _is_input_error(error: Exception) -> bool:
    if isinstance(error, CliError):
        return True
    # Imported only now: these modules import jax, which a bad --model path should not wait for.
    from safetensors import SafetensorError

    from jaxengine.chat_template import ChatTemplateError
    from jaxengine.checkpoint.hf import CheckpointError
    from jaxengine.data.pipeline import DataError
    from jaxengine.models.config import UnsupportedArchitectureError
    from jaxengine.quantize import QuantizationError
    from jaxengine.sampler import PromptError
    from jaxengine.tokenizer import TokenizerError

    # A weights file cut short (SafetensorError), a data file that is not one (DataError) and a serving copy's
    # damaged description (QuantizationError) are the user's to fix too: they were tracebacks from generate
    # and from eval --metric loss.
    return isinstance(error, (CheckpointError, UnsupportedArchitectureError, TokenizerError, ChatTemplateError,
                              PromptError, SafetensorError, DataError, QuantizationError))


def run_reporting_errors(command: str, body: Callable[[], int]) -> int:
    """Runs ``body``; a known input error becomes ``jaxengine COMMAND: error: ...`` on stderr and exit 2."""
    try:
        return body()
    except Exception as error:
        if not _is_input_error(error):
            raise
        print(f"jaxengine {command}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
