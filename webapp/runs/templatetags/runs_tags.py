"""Template helpers of the run pages."""
from __future__ import annotations

import json
from typing import Any

from django import template

register = template.Library()


@register.filter
def get_item(mapping: Any, key: str) -> Any:
    """``mapping[key]`` for keys a template cannot spell (``final_metrics|get_item:"eval/loss"``)."""
    if isinstance(mapping, dict):
        return mapping.get(key)
    return None


@register.filter
def duration_short(seconds: float | None) -> str:
    """``3725`` → ``1h 2m``; ``75`` → ``1m 15s``; ``9.4`` → ``9s``."""
    if seconds is None:
        return "—"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


@register.inclusion_tag("runs/_spec_field.html")
def spec_field(field, initial: dict, errors: dict) -> dict[str, Any]:
    """One schema-built input with its value, help text and errors."""
    value = initial.get(field.name, field.default)
    return {
        "json_value": json.dumps(value) if field.widget == "json" and value not in (None, "") else (value or ""),
        "field": field,
        "value": "" if value is None else value,
        "selected": [str(item) for item in value] if isinstance(value, (list, tuple)) else [str(value)],
        "errors": errors.get(field.name, []),
        "default": field.default,
    }
