"""Shared by ``jaxengine inspect`` and ``jaxengine generate``: checking a model directory before any
heavy import, reading safetensors headers, and turning known errors into one-line messages (exit 2)."""
from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable
from pathlib import Path

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
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise CliError(f"{config_path}: line {error.lineno}: not valid JSON ({error.msg})") from None
    if not isinstance(config, dict):
        raise CliError(f"{config_path}: expected a JSON object")
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


def safetensors_summary(model_dir: Path) -> dict:
    """Files, tensor count, element count and dtypes of the ``*.safetensors`` files, from their headers only."""
    files = sorted(model_dir.glob("*.safetensors"))
    tensors, elements, dtypes = 0, 0, set()
    for path in files:
        with path.open("rb") as handle:
            (header_size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(header_size))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            tensors += 1
            count = 1
            for size in entry["shape"]:
                count *= size
            elements += count
            dtypes.add(entry["dtype"])
    return {"files": len(files), "tensors": tensors, "elements": elements, "dtypes": sorted(dtypes)}


def _is_input_error(error: Exception) -> bool:
    if isinstance(error, CliError):
        return True
    # Imported only now: these modules import jax, which a bad --model path should not wait for.
    from safetensors import SafetensorError

    from jaxengine.chat_template import ChatTemplateError
    from jaxengine.checkpoint.hf import CheckpointError
    from jaxengine.data.pipeline import DataError
    from jaxengine.models.config import UnsupportedArchitectureError
    from jaxengine.sampler import PromptError
    from jaxengine.tokenizer import TokenizerError

    # A weights file cut short (SafetensorError) and a data file that is not one (DataError) are the user's
    # to fix too: they were tracebacks from generate and from eval --metric loss.
    return isinstance(error, (CheckpointError, UnsupportedArchitectureError, TokenizerError, ChatTemplateError,
                              PromptError, SafetensorError, DataError))


def run_reporting_errors(command: str, body: Callable[[], int]) -> int:
    """Runs ``body``; a known input error becomes ``jaxengine COMMAND: error: ...`` on stderr and exit 2."""
    try:
        return body()
    except Exception as error:
        if not _is_input_error(error):
            raise
        print(f"jaxengine {command}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
