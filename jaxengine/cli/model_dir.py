"""Shared by ``jaxengine inspect`` and ``jaxengine generate``: checking a model directory before any
heavy import, reading safetensors headers (by the reader base model registration uses), and turning
known errors into one-line messages (exit 2)."""
from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

from jaxengine.checkpoint import safetensors_header
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
        raise CliError(f"--model {value}: no config.json ({_what_it_holds(model_dir)}); give a Hugging Face-format "
                       f"model directory: its config.json (architectures one of {_supported()}), its safetensors "
                       "weights and its tokenizer")
    read_json_object(config_path, error=CliError,
                     advice=f"a model's config.json is one JSON object as Hugging Face saves it, naming its "
                            f"architectures (one of {_supported()}): save it again from the model's repository")
    return model_dir


def _supported() -> str:
    from jaxengine.models.config import supported_architectures

    return ", ".join(supported_architectures())


# How many of a directory's entries a refusal names: enough to recognise the directory by.
_ENTRIES_NAMED = 8


def _what_it_holds(directory: Path) -> str:
    """What a directory given as a model holds, in words: its first entries, and a folder below it holding a
    config.json (a Hugging Face cache's repository folder holds its model under snapshots/<revision>/)."""
    entries = sorted(directory.iterdir(), key=lambda entry: entry.name)
    if not entries:
        return "the directory is empty"
    names = [entry.name + ("/" if entry.is_dir() else "") for entry in entries[:_ENTRIES_NAMED]]
    more = f" and {len(entries) - _ENTRIES_NAMED} more" if len(entries) > _ENTRIES_NAMED else ""
    said = f"the directory holds {', '.join(names)}{more}"
    below = next((found.parent for found in sorted(directory.glob("*/config.json")) + sorted(
        directory.glob("*/*/config.json")) if found.is_file()), None)
    if below is not None:
        said += f"; {below.relative_to(directory)} holds a config.json: give that directory"
    return said


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


def read_safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (tensor name -> dtype, shape, offsets), without reading any
    tensor, by the reader base model registration uses (``jaxengine.checkpoint.safetensors_header``): a
    file cut short, or otherwise one that generate and train would refuse, is a CliError naming it."""
    return safetensors_header.read_safetensors_header(path, error=CliError)


def safetensors_summary(model_dir: Path) -> dict:
    """Files, tensor count, element count, dtypes and parameter count of the safetensors files the loader reads
    (the shards the index lists, or ``model.safetensors``), from their headers only. The parameters are the model's weights as stored, so a config.json that does not
    describe them is not believed; in a quantized serving copy (``jaxengine.quantize``) each ``.qweight`` of
    codes counts as the weights it stands for (two per byte under int4) and its ``.scales`` not at all."""
    from jaxengine.job import QUANTIZATION_FILE

    quantization = model_dir / QUANTIZATION_FILE
    bits = None
    if quantization.is_file():
        bits = read_json_object(quantization, error=CliError, advice="export the serving copy again").get("bits")
    files = safetensors_header.checkpoint_files(model_dir, error=CliError)  # those generate and train load
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
