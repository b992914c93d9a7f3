"""Text that people send, checked where it is written (the services), so that a web form, the API and a
script meet the same limits, each refusal naming the field.

NUL (U+0000) is refused everywhere: PostgreSQL stores no NUL in text or JSON (the INSERT fails, a 500),
and Django's form fields already refuse it, but the API's bodies and the views that read ``request.POST``
themselves did not.
"""
from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError

NUL = "\x00"
# Notes and guidelines are Markdown rendered on page views; no one writes more by hand.
LONG_TEXT_MAX_CHARS = 20_000
_NUL_REFUSED = "text here cannot hold one"


def checked_text(value: str, *, field: str, max_length: int | None = None) -> str:
    """``value`` unchanged once it holds no NUL and fits ``max_length`` characters; else a
    ValidationError keyed by ``field``."""
    if (position := value.find(NUL)) >= 0:
        raise ValidationError({field: f"a NUL character (\\x00) at position {position + 1}; remove it: {_NUL_REFUSED}"})
    if max_length is not None and len(value) > max_length:
        raise ValidationError({field: f"{len(value):,} characters; at most {max_length:,}"})
    return value


def checked_json(value: Any, *, field: str) -> Any:
    """``value`` (decoded JSON: dicts, lists, strings, numbers) unchanged once no key or string in it holds a
    NUL; else a ValidationError keyed by the dotted path to the value (``config.layers.0.name``; a key
    holding one is named by its mapping's path). A blank ``field`` leaves the path bare (a job spec's
    ``data.train``)."""
    pending = [(field, value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            checked_text(item, field=path)
        elif isinstance(item, dict):
            for key, child in item.items():
                if NUL in str(key):
                    raise ValidationError({path: f"a key holding a NUL character (\\x00); remove it: {_NUL_REFUSED}"})
                pending.append((f"{path}.{key}" if path else str(key), child))
        elif isinstance(item, (list, tuple)):
            pending.extend((f"{path}.{index}" if path else str(index), child) for index, child in enumerate(item))
    return value
