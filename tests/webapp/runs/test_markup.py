"""Markdown from people and models is rendered on every page view, so no text may take long to render
or crash the page: Python-Markdown walks its link brackets character by character (12 KB of nested
brackets took 7 s, 20 KB of '[' 47 s) and recurses into nested lists (RecursionError, a 500)."""
import time

import pytest

from webapp.runs.markup import render_markdown

HOSTILE = {
    "nested brackets": "[" * 6000 + "a" + "]" * 6000,
    "open brackets": "[" * 20_000,
    "open images": "![" * 10_000,
    "reference links": "[a][" * 5000,
    "empty links": "[](" * 6600,
    "nested lists": "- " * 5000 + "a",
    "nested ordered lists": "1. " * 4000 + "a",
    "a chat answer's worth": "[" * 100_000,
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_markdown_renders_quickly_as_plain_text(text):
    started = time.perf_counter()
    html = str(render_markdown(text))
    assert time.perf_counter() - started < 1.0
    assert "shown as written" in html and text[:50].replace("<", "&lt;") in html  # escaped, nothing lost


def test_the_plain_text_fallback_is_escaped_and_keeps_its_lines():
    html = str(render_markdown("<script>alert(1)</script>\n" + "[" * 20_000))
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;<br>" in html


def test_ordinary_markdown_with_many_links_is_still_markdown():
    text = "See [the run](https://example.com/r) and [b](https://example.com/b). " * 250
    html = str(render_markdown(text))
    assert html.count('<a href="https://example.com/r"') == 250 and "shown as written" not in html
