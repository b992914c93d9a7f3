"""Reading the small JSON files of a model directory (config.json, tokenizer_config.json,
generation_config.json, ...) with one-line errors. Jax-free."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# What json.loads raises for a text it cannot read: a JSONDecodeError or UnicodeDecodeError (both ValueErrors), a
# ValueError for a number past Python's 4,300-digit limit on int(), a RecursionError for arrays nested past the
# recursion limit. A model directory's files can come from an uploaded archive: each is a refusal in words
# (``json_problem``), not a traceback.
UNREADABLE_JSON = (ValueError, RecursionError)


def json_problem(exception: Exception) -> str:
    """What was wrong with a JSON text that ``json.loads`` refused with ``exception`` (one of ``UNREADABLE_JSON``)."""
    if isinstance(exception, RecursionError):
        return "it nests too deeply to be read"
    if isinstance(exception, (json.JSONDecodeError, UnicodeDecodeError)):
        return str(exception)
    return "a number of over 4,300 digits, more than any field takes"


def read_json_object(path: Path, *, error: type[Exception] = ValueError, advice: str = "") -> dict[str, Any]:
    """The JSON object in ``path``. A file that is not UTF-8 text, not JSON, or JSON but not an object
    raises ``error`` naming the file (and the line, for bad JSON), then ``advice`` after a semicolon:
    a non-UTF-8 file was a UnicodeDecodeError traceback from every reader, and each reader worded the rest
    its own way."""
    remedy = f"; {advice}" if advice else ""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as problem:
        raise error(f"{path}: not UTF-8 text (byte {problem.start} is not valid UTF-8){remedy}") from None
    except json.JSONDecodeError as problem:
        raise error(f"{path}: line {problem.lineno}: not valid JSON ({problem.msg}){remedy}") from None
    except UNREADABLE_JSON as problem:
        raise error(f"{path}: not valid JSON ({json_problem(problem)}){remedy}") from None
    if not isinstance(value, dict):
        raise error(f"{path}: expected a JSON object at the top level, found {type(value).__name__}{remedy}")
    return value
