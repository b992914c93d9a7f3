"""Warnings a page can act on.

Warnings travel as strings (a launch's are logged, deduplicated, shown as messages, sent as JSON); one that advises
something Temper can do carries where to do it as attributes of the string, so that whatever only reads text is
unchanged and a page that knows of them (the launch page's live check) shows a link beside the text.
"""
from __future__ import annotations

from typing import Any


class ActionWarning(str):
    """A warning and the page that does what it advises: ``url`` (its address) and ``label`` (the link's text)."""

    url: str
    label: str

    def __new__(cls, text: str, *, url: str, label: str) -> ActionWarning:
        warning = super().__new__(cls, text)
        warning.url, warning.label = url, label
        return warning


def warning_action(warning: str) -> dict[str, Any] | None:
    """``{"url", "label"}`` of an ``ActionWarning``, None for a warning that is text alone (the JSON a page reads)."""
    return {"url": warning.url, "label": warning.label} if isinstance(warning, ActionWarning) else None
