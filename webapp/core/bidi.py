"""Bidi controls in people's text stay inside that text on every page.

Design note: names, dataset rows and model output may hold Unicode bidi controls (U+202E RIGHT-TO-LEFT
OVERRIDE and the other embeddings and overrides, U+2066-2069 isolates). Unclosed, one reorders the rest
of its line: the page's own words after a run's name read backwards. Two layers keep them in:

- ``static/temper.css`` shows the elements that carry such text (links, ``<bdi>``, ``.text``…) as
  bidi isolates (``unicode-bidi: plaintext``), so what an override opens ends with the element;
- Chromium implements an isolate with bidi control characters of its own, so an isolate control in
  the text (a stray U+2069 POP DIRECTIONAL ISOLATE, or a U+2066 left open) pairs with those and
  opens the isolate up. ``BidiBalanceMiddleware`` therefore balances the controls of every text
  run of an HTML page (the text between two tags, where escaped text from a person always lies
  whole): an unmatched closer is dropped, openers left open are closed at the run's end;
- a name put beside other words where no element can hold it (a flash message, the page
  ``<title>``, an ``<option>``'s label) is ``isolated``: wrapped in FSI…PDI (``|isolated`` in
  templates, ``{% load temper %}``).

The templates hold no bidi controls themselves (a test checks), so every control a page carries
came from data; balanced ones (``⁨name⁩``) pass unchanged.
"""
from __future__ import annotations

import re

from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin

LRE, RLE, PDF, LRO, RLO = "\u202a", "\u202b", "\u202c", "\u202d", "\u202e"
LRI, RLI, FSI, PDI = "\u2066", "\u2067", "\u2068", "\u2069"
EMBEDDINGS = frozenset((LRE, RLE, LRO, RLO))
ISOLATES = frozenset((LRI, RLI, FSI))
_CONTROL_RANGES = "\u202a-\u202e\u2066-\u2069"
CONTROLS = re.compile(f"[{_CONTROL_RANGES}]")
_UTF8_CONTROLS = re.compile(b"\xe2\x80[\xaa-\xae]|\xe2\x81[\xa6-\xa9]")


# Tags, and the elements whose text is not laid out as text (or is a form control's own value).
_OPAQUE_PATTERN = r"<(?:script\b.*?</script\s*>|style\b.*?</style\s*>|textarea\b.*?</textarea\s*>|!--.*?-->|[^>]*>)"
_OPAQUE = re.compile(_OPAQUE_PATTERN, re.DOTALL | re.IGNORECASE)
# From the start of a text run or of a tag: the tags, and the text that holds no control, up to the
# first control in text, in one match: the scan ``_OPAQUE.finditer`` would make, without a Python
# step per tag. A ``<`` that begins no tag is text, as for ``finditer``; ``tag`` spans the last tag.
# (A plain ``*``: inside a possessive ``*+`` Python 3.11's re raises SystemError on ``tag``'s span.)
_UP_TO_A_CONTROL = re.compile(
    rf"(?:(?P<tag>{_OPAQUE_PATTERN})|[^<{_CONTROL_RANGES}]+|(?!{_OPAQUE_PATTERN})<)*", re.DOTALL | re.IGNORECASE)


def balance_bidi_controls(text: str) -> str:
    """``text`` with its bidi embeddings, overrides and isolates paired: a PDF or PDI that closes
    nothing opened in ``text`` is dropped, and what is still open at its end is closed there
    (Unicode Bidirectional Algorithm rules X6a and X7: a PDI also closes the embeddings opened
    inside its isolate, a PDF does not reach out of an isolate)."""
    kept: list[str] = []
    opened: list[str] = []
    copied = 0
    for control in CONTROLS.finditer(text):
        char = control.group()
        if char in EMBEDDINGS or char in ISOLATES:
            opened.append(char)
            continue
        if char == PDF and opened and opened[-1] in EMBEDDINGS:
            opened.pop()
            continue
        if char == PDI and any(opener in ISOLATES for opener in opened):
            while opened.pop() not in ISOLATES:
                pass
            continue
        kept.append(text[copied:control.start()])  # a closer that closes nothing: dropped
        copied = control.end()
    if not kept and not opened:
        return text
    kept.append(text[copied:])
    kept.extend(PDI if opener in ISOLATES else PDF for opener in reversed(opened))
    return "".join(kept)


def isolated(text: str) -> str:
    """``text`` between FSI and PDI, its own controls balanced: a name put into a sentence of plain
    text (a flash message) reorders nothing of the sentence after it, in any browser."""
    return f"{FSI}{balance_bidi_controls(str(text))}{PDI}"


def balance_html_text(html: str) -> str:
    """``html`` with the bidi controls of each text run between tags balanced (see the module note);
    tags, comments and the contents of script, style and textarea are left as they are. Only the
    runs that hold a control are cut out and balanced: one regex match skips to the next."""
    if not CONTROLS.search(html):
        return html
    pieces: list[str] = []
    copied = position = 0
    while (skipped := _UP_TO_A_CONTROL.match(html, position)).end() < len(html):
        run_start = skipped.end("tag") if skipped.start("tag") >= 0 else position
        next_tag = _OPAQUE.search(html, skipped.end())
        run_end = next_tag.start() if next_tag else len(html)
        pieces += [html[copied:run_start], balance_bidi_controls(html[run_start:run_end])]
        copied = position = run_end
    pieces.append(html[copied:])
    return "".join(pieces)


class BidiBalanceMiddleware(MiddlewareMixin):
    """Balances the bidi controls in the text of every HTML page (``balance_html_text``)."""

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if (response.streaming or response.has_header("Content-Encoding")
                or not response.get("Content-Type", "").startswith("text/html")):
            return response  # a file, an event stream or a compressed body: no page text to read
        body = response.content  # joined anew on each access: read once
        charset = response.charset or "utf-8"
        if charset.lower().replace("-", "") == "utf8" and not _UTF8_CONTROLS.search(body):
            return response  # the common case, seen without decoding the page
        try:
            text = body.decode(charset, errors="surrogateescape")
        except (LookupError, UnicodeDecodeError):
            return response  # not text in the charset it names: a 500 here would hide the page's own fault
        balanced = balance_html_text(text)
        if balanced != text:
            response.content = balanced.encode(charset, errors="surrogateescape")
            if response.has_header("Content-Length"):
                response["Content-Length"] = str(len(response.content))
        return response
