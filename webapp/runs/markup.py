"""Markdown notes rendered safely: Markdown to HTML, then ``nh3`` keeps only harmless tags and
attributes (no scripts, no event handlers, no ``javascript:`` links).

Raw HTML in the text is not markup here but text, shown as written: an answer that explains
``<script>`` tags, or a note that quotes ``<div>``, reads as it was written instead of losing those
words to the sanitizer (Python-Markdown passes raw HTML through; ``_RawHtmlAsText`` turns that off).

Rendering happens on every page view, so it must stay quick whatever the text. Python-Markdown finds a
link's text and address by walking the block character by character from each ``[`` (and each ``](``)
to its partner, or to the block's end when there is none: 20,000 ``[`` took 47 s, 12 KB of nested
brackets 7 s. ``_link_scan_length`` adds up those walks in one pass; past ``MAX_LINK_SCAN`` characters
(about 0.1 s of Python-Markdown's time) the text is shown as written instead, escaped, its lines kept.
Lists or quotes nested on one line past 32 deep (a RecursionError past a few hundred, after up to 0.7 s)
are shown as written too, and a RecursionError that comes anyway.
"""
from __future__ import annotations

import re

import markdown
import nh3
from django.utils.html import linebreaks
from django.utils.safestring import SafeString, mark_safe
from markdown.extensions import Extension

ALLOWED_TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "code", "pre", "blockquote",
    "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td", "del",
}
MAX_LINK_SCAN = 500_000
_BLOCK_BREAK = re.compile(r"\n[ \t]*\n")
# A line opening lists or quotes inside each other this many times ("- - - - a", "> > > a").
_DEEP_NESTING = re.compile(r"^(?:[ \t]*(?:[-*+]|\d{1,9}[.)])[ \t]+|[ \t]*>){32}", re.MULTILINE)


class _RawHtmlAsText(Extension):
    """Raw HTML blocks and inline tags stay text (escaped on output), as in CommonMark's safe renderers."""

    def extendMarkdown(self, md):
        md.preprocessors.deregister("html_block")
        md.inlinePatterns.deregister("html")


def _link_scan_length(text: str) -> int:
    """How many characters Python-Markdown's link patterns walk over in ``text``: from each ``[`` to its
    ``]``, from each ``](`` to its ``)``, or to the end of the block (paragraphs at most; an over-estimate
    where blocks are smaller) when the partner is missing."""
    total = 0
    for block in _BLOCK_BREAK.split(text):
        if block.count("[") * len(block) <= MAX_LINK_SCAN:
            total += block.count("[") * len(block)  # a bound: no bracket walks past its block
            continue
        brackets: list[int] = []
        parentheses: list[tuple[int, bool]] = []  # (position, opens a link's address)
        for position, character in enumerate(block):
            if character == "[":
                brackets.append(position)
            elif character == "]" and brackets:
                total += position - brackets.pop()
            elif character == "(":
                parentheses.append((position, position > 0 and block[position - 1] == "]"))
            elif character == ")" and parentheses:
                start, address = parentheses.pop()
                total += position - start if address else 0
        total += sum(len(block) - start for start in brackets)
        total += sum(len(block) - start for start, address in parentheses if address)
        if total > MAX_LINK_SCAN:
            break
    return total


def _as_written(text: str) -> SafeString:
    return mark_safe('<p class="muted">Too deeply nested to read as Markdown: shown as written.</p>'
                     + linebreaks(text, autoescape=True))


def render_markdown(text: str, *, line_breaks: bool = False) -> SafeString:
    """``text`` (Markdown) as sanitized HTML, safe to put in a page. With ``line_breaks`` every line break
    outside code is kept (``<br>``) instead of joining the lines of a paragraph, as Markdown does.
    Text that Python-Markdown would take long over, or recurse too deeply into, is shown as written."""
    text = text or ""
    if _DEEP_NESTING.search(text) or _link_scan_length(text) > MAX_LINK_SCAN:
        return _as_written(text)
    extensions = [_RawHtmlAsText(), "fenced_code", "tables", *(["nl2br"] if line_breaks else [])]
    try:
        html = markdown.markdown(text, extensions=extensions)
    except RecursionError:
        return _as_written(text)
    # nh3 adds rel="noopener noreferrer" to links itself.
    return mark_safe(nh3.clean(html, tags=ALLOWED_TAGS, attributes={"a": {"href", "title"}},
                               url_schemes={"http", "https", "mailto"}))
