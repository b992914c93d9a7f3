"""Reading a safetensors file's header without its tensors (jax-free): the one reader that base model
registration (``webapp.basemodels.inspection``) and ``jaxengine inspect`` share, so that both refuse
the same damaged files with the same words; and which files a model directory's weights are in, as the
loader (``jaxengine.checkpoint.hf``) reads them.

A safetensors file is an 8-byte little-endian length, that many bytes of JSON naming every tensor's
dtype, shape and ``data_offsets`` (begin, end) in the data section, then the data section. The
safetensors library, which loads the weights for training and chat, demands that the tensors' data
fill the data section exactly; a copy that stopped part way keeps an intact header, so a reader of the
header alone would describe a whole model. Here the offsets are checked against the file's size.
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from jaxengine.json_files import UNREADABLE_JSON, json_problem

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# A header lists names, dtypes, shapes and offsets; even models with tens of thousands of tensors stay
# far below this. Larger means a corrupt length field.
MAX_HEADER_BYTES = 100 * 1024 * 1024
# A tensor dimension past this is no model's (and the database's integers end at 2**63).
MAX_DIMENSION = 2**53
# The bits of an element of each dtype the safetensors library reads (its ``Dtype``); it refuses any other.
DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
              "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
              "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}


def read_safetensors_header(path: Path, *, error: type[Exception] = ValueError) -> dict:
    """The JSON header of the safetensors file ``path``: tensor name -> {dtype, shape, data_offsets}, plus an
    optional ``__metadata__`` entry. A file that is not one, or whose tensors' data does not fill it exactly
    (cut short by an interrupted copy, or with bytes after the last tensor), raises ``error`` naming the file
    and what to do."""
    if not path.is_file():
        raise not_a_file(path, error=error)
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise error(f"{path}: too short to be a safetensors file (no 8-byte header length); the file is "
                        "truncated or not a safetensors file: copy or convert the weights again")
        (header_bytes,) = struct.unpack("<Q", prefix)
        if header_bytes > MAX_HEADER_BYTES:
            raise error(f"{path}: header length {header_bytes} is implausible; the file is corrupt: copy or "
                        "convert the weights again")
        raw = handle.read(header_bytes)
    if len(raw) != header_bytes:
        raise error(f"{path}: truncated header ({len(raw)} of {header_bytes} bytes; an interrupted download or "
                    "copy?): copy it again")
    try:
        header = json.loads(raw)
    except UNREADABLE_JSON as problem:
        raise error(f"{path}: header is not valid JSON ({json_problem(problem)}); the file is corrupt: copy or "
                    "convert the weights again") from None
    if not isinstance(header, dict):
        raise error(f"{path}: header is not a JSON object; the file is corrupt: copy or convert the weights again")
    metadata = header.get("__metadata__")
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(value, str) for value in metadata.values())):
        raise error(f"{path}: the header's __metadata__ is not an object of strings; the file is corrupt: copy or "
                    "convert the weights again")
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if (not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str) or not isinstance(shape, list)
                or not all(isinstance(size, int) and not isinstance(size, bool) and 0 <= size < MAX_DIMENSION
                           for size in shape)):
            raise error(f"{path}: tensor {name!r} has no valid dtype and shape in the header (a string and a list "
                        "of sizes); the file is corrupt")
        offsets = entry.get("data_offsets")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(offset, int) and not isinstance(offset, bool) for offset in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise error(f"{path}: tensor {name!r} has no valid data_offsets in the header (two byte offsets, "
                        "begin <= end); the file is corrupt")
        # As the loader checks them: a header that misstates them was described (its parameters counted, a base
        # model registered) while generate, train and the chat refused the file.
        dtype = entry["dtype"]
        if dtype not in DTYPE_BITS:
            raise error(f"{path}: tensor {name!r} has dtype {dtype!r}, which is none of safetensors' "
                        f"({', '.join(DTYPE_BITS)}); the file is corrupt: copy or convert the weights again")
        bits = math.prod(shape) * DTYPE_BITS[dtype]
        if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
            needed = bits // 8 if bits % 8 == 0 else bits / 8
            raise error(f"{path}: tensor {name!r} ({dtype}, shape {shape}) needs {needed} bytes, but its "
                        f"data_offsets hold {offsets[1] - offsets[0]}; the file is corrupt: copy or convert the "
                        "weights again")
        spans.append((offsets[0], offsets[1], name))
    data_end = 0
    for begin, end, name in sorted(spans):
        if begin != data_end:  # the tensors' data lie end to end from the data section's first byte
            raise error(f"{path}: tensor {name!r}'s data starts at byte {begin} of the data section, where the data "
                        f"before it ends at byte {data_end}; the file is corrupt: copy or convert the weights again")
        data_end = end
    data_bytes = path.stat().st_size - 8 - header_bytes
    if data_end > data_bytes:
        raise error(f"{path}: the header places tensor data up to byte {data_end} of the data section, but the "
                    f"file holds {data_bytes}; the file is truncated (an interrupted download or copy?): copy it "
                    "again")
    if data_end < data_bytes:
        raise error(f"{path}: {data_bytes - data_end} bytes after the last tensor's data, which the loader "
                    "refuses; the file is corrupt: copy it again")
    return header


def read_weight_map(index_path: Path, *, error: type[Exception] = ValueError) -> dict[str, str]:
    """The ``weight_map`` (tensor name -> shard file name) of a ``model.safetensors.index.json``; an index that
    is not JSON or lacks the map raises ``error`` naming it (it was a KeyError or JSONDecodeError)."""
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8")).get("weight_map")
        problem = None if isinstance(weight_map, dict) and all(
            isinstance(file, str) for file in weight_map.values()) else 'no "weight_map" of file names'
    except UNREADABLE_JSON as exception:
        problem = f"not valid JSON: {json_problem(exception)}"
    except AttributeError:  # a JSON list or number
        problem = "not a JSON object"
    if problem is not None:
        raise error(f'{index_path}: not a safetensors index ({problem}); it must be a JSON object whose '
                    '"weight_map" maps each tensor name to its file')
    return weight_map


def not_a_file(path: Path, *, error: type[Exception] = ValueError) -> Exception:
    """The refusal of a weights path that is there but is no file: opened, it was an IsADirectoryError, or from the
    safetensors library an OSError 'No such device' naming no file."""
    return error(f"{path}: not a file (a directory?); copy or convert the weights again")


def missing_shard(path: Path, *, error: type[Exception] = ValueError) -> Exception:
    """The refusal of a shard the index lists that is not there."""
    return error(f"{path}: listed in {INDEX_FILE} but missing")


def checkpoint_files(model_dir: Path, *, error: type[Exception] = ValueError) -> list[Path]:
    """The safetensors files the loader reads: each shard ``model.safetensors.index.json`` lists when there is one,
    else ``model.safetensors``; none when neither is there. Any other ``*.safetensors`` file is not the model's
    (a ``consolidated.safetensors`` beside the shards holds the same weights again). A damaged index, or a shard it
    lists that is missing, raises ``error`` in the loader's words."""
    index_path = model_dir / INDEX_FILE
    if index_path.exists():
        files = [model_dir / name for name in sorted(set(read_weight_map(index_path, error=error).values()))]
        for file in files:
            if not file.exists():
                raise missing_shard(file, error=error)
        return files
    return [model_dir / SINGLE_FILE] if (model_dir / SINGLE_FILE).exists() else []
