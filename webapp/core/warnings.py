"""Warnings a page can act on.

Warnings travel as strings (a launch's are logged, deduplicated, shown as messages, sent as JSON); one that advises
something Temper can do carries where to do it as attributes of the string, so that whatever only reads text is
unchanged and a page that knows of them shows a link beside the text: the launch page's live check, the messages
after a launch and the run's log (which keeps the action beside the line, ``RunLogLine.action``), by
``warning_html``.
"""
from __future__ import annotations

from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString


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


def own_address(url: str) -> bool:
    """Whether ``url`` is a path of this app: an action is linked only so (``//host`` is another site's)."""
    return url.startswith("/") and not url.startswith(("//", "/\\"))


def warning_html(warning: str, action: dict[str, Any] | None = None) -> SafeString:
    """The warning's text, escaped, and the link of its action (``action``, else the warning's own as an
    ``ActionWarning``) where that is a page of this app; the text alone otherwise."""
    action = action or warning_action(warning)
    if not action or not own_address(str(action.get("url", ""))):
        return format_html("{}", warning)
    return format_html('{} <a class="warning-action" href="{}">{}</a>', warning, action["url"], action["label"])
