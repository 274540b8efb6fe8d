"""One chromium (Debian's, driven by Playwright) for the browser tests, on the test API.

Every page runs with the network to anything but loopback blocked, records what it tried
to reach, and leaves a screenshot in its test's output folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pytest

CHROMIUM = os.environ.get("DIFFQ_CHROMIUM", "/usr/bin/chromium")
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: pip install -e '.[test]'")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no chromium at {CHROMIUM}: run scripts/browser (as root) to install it")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


@dataclass
class Visit:
    page: object
    base_url: str
    output: Path
    blocked: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def sign_in(self, key: str) -> None:
        """Open the page and enter the key as a person would."""
        self.page.goto(f"{self.base_url}/")
        self.page.fill("#api-key", key)
        self.page.click("#key-form button[type=submit]")
        self.page.wait_for_selector("#f-model option", state="attached")

    def assert_clean(self) -> None:
        """Nothing off loopback was asked for and the CSP refused nothing."""
        assert self.blocked == [], self.blocked
        refused = [e for e in self.console_errors if "Content Security Policy" in e]
        assert refused == [], refused


@pytest.fixture
def visit(browser, api_server, tmp_path):
    context = browser.new_context(viewport={"width": 1200, "height": 900}, accept_downloads=True)
    found = Visit(page=None, base_url=api_server.url, output=tmp_path)

    def guard(route):
        if urlparse(route.request.url).hostname in LOOPBACK:
            route.continue_()
        else:
            found.blocked.append(route.request.url)
            route.abort("blockedbyclient")

    context.route("**/*", guard)
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.on("console", lambda m: m.type == "error" and found.console_errors.append(m.text))
    page.on("dialog", lambda d: (found.dialogs.append(d.message), d.dismiss()))
    found.page = page
    yield found
    shot = tmp_path / "screenshot.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    context.close()
