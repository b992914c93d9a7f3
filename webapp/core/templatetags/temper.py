"""Template filters and tags shared by every page: ``{% load temper %}``."""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

from django import template
from django.template.defaultfilters import filesizeformat
from django.utils import timezone
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import mark_safe
from django.utils.timesince import timesince

from webapp.core import bidi
from webapp.core.submissions import TOKEN_FIELD, new_submission_token
from webapp.core.warnings import warning_html

register = template.Library()

# The chat app's URL names that belong to the Arena tab (webapp/chat/urls.py).
ARENA_URL_NAMES = frozenset({"arena", "leaderboard", "arena_export", "arena_to_review", "arena_review_create",
                             "battle", "vote"})


_LITERAL = re.compile(r"(?<!`)``([^`]+?)``(?!`)")  # not a ```fence```


@register.filter
def literals(text: str) -> str:
    """Docstring text as HTML: escaped, its ``literals`` as <code> (the reward functions' summaries
    showed their double backquotes)."""
    return mark_safe(_LITERAL.sub(lambda match: f"<code>{match.group(1)}</code>", conditional_escape(text)))


@register.filter
def with_action(message: str, action: dict | None) -> str:
    """A log line's text with the link of the action it advises (``core.warnings.warning_html``), both escaped."""
    return warning_html(message, action)


@register.filter
def grouped(value):
    """A count with its thousands separated, as ``jaxengine.words.counted(grouped=True)`` writes one: 10838 ->
    '10,838'. Every count of rows, tokens, steps or items a page shows goes through it; anything but a whole
    number (None, a "—" put before it) passes unchanged."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return value


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


@register.simple_tag
def disk_size(value: int) -> str:
    """A size as every page shows one, "1.2 GB" (Django's ``filesizeformat``), with its exact bytes kept: in its
    title for a reader ("1,288,490,189 bytes") and in ``data-bytes`` for a script."""
    return format_html('<span class="size" data-bytes="{}" title="{} bytes">{}</span>', value, grouped(value),
                       filesizeformat(value))


@register.filter
def pretty_json(value) -> str:
    """``value`` as indented JSON (escaped like any text): a config.json shown as the file reads, not as
    Python's repr of it (True, None, single quotes). Keys sorted, as transformers writes config.json: the
    order it was stored in is lost on PostgreSQL (jsonb keeps keys by length, then bytes)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@register.filter
def isolated(value) -> str:
    """``value`` between FSI and PDI (``webapp.core.bidi.isolated``), for a person's text put beside
    other words where no element can isolate it: the page ``<title>``, an ``<option>``'s label. A
    plain str, so the template escapes it as any other value."""
    return bidi.isolated(value)


@register.filter
def when(value: datetime | None) -> str:
    """``2026-12-05 14:05 UTC``: a moment as the pages show one, in the site's time zone (``TIME_ZONE``) and
    naming it, so that no table leaves a reader guessing whose clock it is; "" for None (``|default``)."""
    if value is None:
        return ""
    local = timezone.localtime(value)
    return f"{local:%Y-%m-%d %H:%M} {local.tzname()}"


@register.filter
def time_ago(value: datetime, now: datetime | None = None) -> str:
    """'just now' under a minute (and for a clock a little ahead), else '5 minutes ago':
    Django's timesince counts in whole minutes and says '0 minutes' for a fresh heartbeat."""
    now = now or timezone.now()
    if now - value < timedelta(minutes=1):
        return "just now"
    return f"{timesince(value, now)} ago"


@register.simple_tag(takes_context=True)
def project_tab(context) -> str:
    """The tab of the project bar the page belongs to: its URL namespace, except that every page under
    ``/p/<slug>/arena/`` (arena, battles, leaderboard) is the Arena tab although the chat app serves it."""
    request = context.get("request")
    match = getattr(request, "resolver_match", None)
    if match is None:
        return ""
    if match.namespace == "chat" and match.url_name in ARENA_URL_NAMES:
        return "arena"
    return match.namespace


@register.simple_tag
def submission_token() -> str:
    """The hidden one-time token of a form that queues work or makes data (``webapp.core.submissions``);
    a new one each time the form is shown (a sending that failed left nothing under its token)."""
    return format_html('<input type="hidden" name="{}" value="{}">', TOKEN_FIELD, new_submission_token())
