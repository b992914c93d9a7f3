"""Text that people send, checked where it is written (the services), so that a web form, the API and a
script meet the same limits, each refusal naming the field."""
from __future__ import annotations

from django.core.exceptions import ValidationError

# Notes and guidelines are Markdown rendered on page views; no one writes more by hand.
LONG_TEXT_MAX_CHARS = 20_000


def checked_text(value: str, *, field: str, max_length: int) -> str:
    """``value`` unchanged once it fits ``max_length`` characters; else a ValidationError keyed by ``field``."""
    if len(value) > max_length:
        raise ValidationError({field: f"{len(value):,} characters; at most {max_length:,}"})
    return value
