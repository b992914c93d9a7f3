"""Headless Chromium (Debian's /usr/bin/chromium) driven by Playwright against pytest-django's
live server, with the real Redis and Celery worker of tests/live.py behind it.

Playwright's sync API runs an event loop in the test thread, which makes Django refuse ORM calls
from that thread ("SynchronousOnlyOperation"); the tests only touch the database between page
actions, never concurrently, so the check is switched off for this directory.
"""
from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="package")
def browser():
    if not CHROMIUM.exists():
        pytest.fail("Chromium is not installed at /usr/bin/chromium: `apt-get install chromium` (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                yield browser
            finally:
                browser.close()


@pytest.fixture
def page_at(browser):
    """``page_at(width, height)``: a fresh page in a window of that size, closed after the test; a test whose
    pages broke the Content-Security-Policy (webapp.core.middleware) fails."""
    contexts, refused = [], []

    def open_page(width: int, height: int):
        context = browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.on("console",
                lambda message: refused.append(message.text) if "Content Security Policy" in message.text else None)
        return page

    try:
        yield open_page
    finally:
        for context in contexts:
            context.close()
    assert not refused, f"the page broke its Content-Security-Policy: {refused}"


@pytest.fixture
def page(page_at):
    """A fresh 1280x900 page (``page_at``'s)."""
    return page_at(1280, 900)
