"""Reading the small JSON files of a model directory (config.json, tokenizer_config.json,
generation_config.json, ...) with one-line errors. Jax-free."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

# What json.loads raises for a text it cannot read: a JSONDecodeError or UnicodeDecodeError (both ValueErrors), a
# ValueError for a number past Python's 4,300-digit limit on int(), a RecursionError for arrays nested past the
# recursion limit. A model directory's files can come from an uploaded archive: each is a refusal in words
# (``json_problem``), not a traceback.
UNREADABLE_JSON = (ValueError, RecursionError)
# The largest float: an integer past it cannot be read as one (OverflowError).
MAX_FLOAT = sys.float_info.max


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
    refuse_values_no_model_holds(value, path=path, error=error)
    return value


def refuse_values_no_model_holds(document: dict, *, path: Path, error: type[Exception] = ValueError) -> None:
    """``error`` naming ``path`` and the first field of ``document`` (nested ones by their dotted path) that is an
    integer past a float's range or a number that is not finite (``1e999`` and ``NaN`` as Python's json reads them),
    or whose name or text holds half of a UTF-16 surrogate pair (JSON's ``"\\udce9"``): a reader turning the first
    into a float (rope_theta, rms_norm_eps, a temperature) raised OverflowError, the second was taken as a value
    (a model built with an infinite rope_theta) and cannot be stored (JSON has no infinity), and the third cannot be
    encoded (the web's model page, which shows config.json, was a 500). Numbers within range are judged by the
    checks of their fields. Base model registration and every ``read_json_object`` of a model directory's files
    (the engine's commands) refuse them in these words."""
    pending: list[tuple[str, object]] = [(str(key), value) for key, value in document.items()]
    while pending:
        field, value = pending.pop()
        if (half := next((char for text in (field, value) if isinstance(text, str) for char in text
                          if "\ud800" <= char <= "\udfff"), None)) is not None:
            raise error(f"{path}: field {field!r} holds half of a UTF-16 surrogate pair (a lone "
                        f"\\u{ord(half):04x} escape), which is no text; fix the field")
        if isinstance(value, dict):
            pending.extend((f"{field}.{key}", inner) for key, inner in value.items())
            continue
        if isinstance(value, list):
            pending.extend((f"{field}[{index}]", inner) for index, inner in enumerate(value))
            continue
        if isinstance(value, int) and abs(value) > MAX_FLOAT:
            said = f"an integer of {len(str(abs(value)))} digits"
        elif isinstance(value, float) and not math.isfinite(value):
            said = repr(value)
        else:
            continue
        raise error(f"{path}: field {field!r} is {said}, past the range of the numbers a config holds (a float's, "
                    "finite); fix the field")
