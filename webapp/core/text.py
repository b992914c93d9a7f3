"""Text that people send, checked where it is written (the services), so that a web form, the API and a
script meet the same limits, each refusal naming the field.

NUL (U+0000) is refused everywhere: PostgreSQL stores no NUL in text or JSON (the INSERT fails, a 500),
and Django's form fields already refuse it, but the API's bodies and the views that read ``request.POST``
themselves did not.

Names that people pick things by (datasets, base models, runs, projects, campaigns) also refuse invisible
format characters (Unicode category Cf: zero-width spaces and joiners, the BOM, bidi controls): "qa3-sft"
and "qa3-sft" + U+200B were two datasets no one could tell apart. They are stored in NFC, so that a
name typed with a combining accent is the same name as one typed with the composed letter (compared as
the unique constraints compare: case-insensitively for datasets and base models).

A lone surrogate (U+D800 to U+DFFF: half of a UTF-16 pair, which JSON may escape as ``"\\ud800"``) is
refused everywhere too: it is no character, UTF-8 cannot encode it, and the database's write failed (a 500)
or a page that wrote it out did.

A model's output cannot be refused: a NUL in it (a byte-fallback tokenizer's <0x00> token) is stored as
U+FFFD, the replacement character, where it would otherwise fail the write (``storable_model_text``).
"""
from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

from django.core.exceptions import ValidationError

NUL = "\x00"
# Notes and guidelines are Markdown rendered on page views; no one writes more by hand.
LONG_TEXT_MAX_CHARS = 20_000
_NUL_REFUSED = "text here cannot hold one"
_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_refused(character: str, index: int) -> str:
    return (f"U+{ord(character):04X} at position {index + 1} is half of a UTF-16 surrogate pair, not a character "
            "(a \\u escape without its other half); send the whole pair or the character itself")


def lone_surrogate_problem(value: str) -> str | None:
    """Why ``value`` is refused for holding a lone surrogate, or None: for checks that raise their own
    errors (the OpenAI-compatible API's, in OpenAI's shape)."""
    surrogate = _SURROGATE.search(value)
    return _surrogate_refused(surrogate.group(), surrogate.start()) if surrogate else None


# Characters of a client's text (an id, a key) that an error shows: a whole 5,000-character id is no help in one.
SHOWN_TEXT_MAX_CHARS = 100


def shown_text(text: str) -> str:
    """``text`` quoted as an error shows it (Python's repr), cut to ``SHOWN_TEXT_MAX_CHARS`` characters and "…"."""
    if len(text) <= SHOWN_TEXT_MAX_CHARS:
        return repr(text)
    return repr(text[:SHOWN_TEXT_MAX_CHARS])[:-1] + "…" + repr(text)[-1]


def storable_model_text(text: str) -> str:
    """A model's text with each NUL as U+FFFD: stored on PostgreSQL, and shown as what it is."""
    return text.replace(NUL, "\ufffd")


def typed_text(value: str) -> str:
    """A textarea's text as its person typed it: browsers send each of its line breaks as CRLF (HTML's form
    encodings do), which a model reads as the tokens of "\\r\\n", sent by no API client and no training row."""
    return value.replace("\r\n", "\n")


def checked_text(value: str, *, field: str, max_length: int | None = None) -> str:
    """``value`` unchanged once it holds no NUL and no lone surrogate and fits ``max_length`` characters;
    else a ValidationError keyed by ``field``."""
    if (position := value.find(NUL)) >= 0:
        raise ValidationError({field: f"a NUL character (\\x00) at position {position + 1}; remove it: {_NUL_REFUSED}"})
    if surrogate := _SURROGATE.search(value):
        raise ValidationError({field: _surrogate_refused(surrogate.group(), surrogate.start())})
    if max_length is not None and len(value) > max_length:
        raise ValidationError({field: f"{len(value):,} characters; at most {max_length:,}"})
    return value


def checked_name(value: str, *, field: str, max_length: int | None = None) -> str:
    """``value`` stripped and in NFC, once it holds no NUL, no invisible format character and fits
    ``max_length`` characters; else a ValidationError keyed by ``field`` naming the character and where."""
    name = checked_text(unicodedata.normalize("NFC", value.strip()), field=field, max_length=max_length)
    for position, character in enumerate(name, start=1):
        if _is_format_character(character):
            described = unicodedata.name(character, "a format character")
            raise ValidationError({field: f"an invisible character, U+{ord(character):04X} ({described}), at position "
                                          f"{position}: remove it (it makes names that look alike but differ)"})
    return name


def visible_name(value: str) -> str:
    """``value`` as ``checked_name`` stores a name, its invisible format characters removed instead of refused:
    for the names stored before they were refused (the migrations that clean them)."""
    return unicodedata.normalize("NFC", "".join(c for c in value if not _is_format_character(c))).strip()


def _is_format_character(character: str) -> bool:
    return unicodedata.category(character) == "Cf"


def checked_json(value: Any, *, field: str, finite: bool = False) -> Any:
    """``value`` (decoded JSON: dicts, lists, strings, numbers) unchanged once no key or string in it holds a
    NUL; else a ValidationError keyed by the dotted path to the value (``config.layers.0.name``; a key
    holding one is named by its mapping's path). A blank ``field`` leaves the path bare (a job spec's
    ``data.train``). ``finite``: NaN and infinity are refused too, for a value stored as it is in a JSON
    column (SQLite's JSON_VALID check and PostgreSQL's jsonb refuse them: the INSERT failed, a 500); a
    job spec's are named by the spec's own checks instead."""
    pending = [(field, value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            checked_text(item, field=path)
        elif finite and isinstance(item, float) and not math.isfinite(item):
            raise ValidationError({path: f"{item} is not a finite number"})
        elif isinstance(item, dict):
            for key, child in item.items():
                if NUL in str(key):
                    raise ValidationError({path: f"a key holding a NUL character (\\x00); remove it: {_NUL_REFUSED}"})
                if surrogate := _SURROGATE.search(str(key)):
                    raise ValidationError({path: f"a key holding {_surrogate_refused(surrogate.group(), surrogate.start())}"})
                pending.append((f"{path}.{key}" if path else str(key), child))
        elif isinstance(item, (list, tuple)):
            pending.extend((f"{path}.{index}" if path else str(index), child) for index, child in enumerate(item))
    return value
