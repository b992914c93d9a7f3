"""Markdown notes rendered safely: Markdown to HTML, then ``nh3`` keeps only harmless tags and
attributes (no scripts, no event handlers, no ``javascript:`` links).

Raw HTML in the text is not markup here but text, shown as written: an answer that explains
``<script>`` tags, or a note that quotes ``<div>``, reads as it was written instead of losing those
words to the sanitizer (Python-Markdown passes raw HTML through; ``_RawHtmlAsText`` turns that off).
"""
from __future__ import annotations

import markdown
import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown.extensions import Extension

ALLOWED_TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "code", "pre", "blockquote",
    "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td", "del",
}


class _RawHtmlAsText(Extension):
    """Raw HTML blocks and inline tags stay text (escaped on output), as in CommonMark's safe renderers."""

    def extendMarkdown(self, md):
        md.preprocessors.deregister("html_block")
        md.inlinePatterns.deregister("html")


def render_markdown(text: str, *, line_breaks: bool = False) -> SafeString:
    """``text`` (Markdown) as sanitized HTML, safe to put in a page. With ``line_breaks`` every line break
    outside code is kept (``<br>``) instead of joining the lines of a paragraph, as Markdown does."""
    extensions = [_RawHtmlAsText(), "fenced_code", "tables", *(["nl2br"] if line_breaks else [])]
    html = markdown.markdown(text or "", extensions=extensions)
    # nh3 adds rel="noopener noreferrer" to links itself.
    return mark_safe(nh3.clean(html, tags=ALLOWED_TAGS, attributes={"a": {"href", "title"}},
                               url_schemes={"http", "https", "mailto"}))
