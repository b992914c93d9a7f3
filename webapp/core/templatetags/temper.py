"""Template filters shared by every page: ``{% load temper %}``."""
from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def count_short(value: int | None) -> str:
    """1234 -> '1.2K', 1_235_000_000 -> '1.24B': parameter and token counts at a glance."""
    if value is None:
        return "—"
    for threshold, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(value) >= threshold:
            scaled = value / threshold
            return f"{scaled:.3g}{suffix}"
    return str(value)
