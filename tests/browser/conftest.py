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
        # The models are loaded (the placeholder option shown before a key is disabled).
        self.page.wait_for_selector("#f-model option:not([disabled])", state="attached")

    def assert_clean(self) -> None:
        """Nothing off loopback was asked for and the CSP refused nothing."""
        assert self.blocked == [], self.blocked
        refused = [e for e in self.console_errors if "Content Security Policy" in e]
        assert refused == [], refused


@pytest.fixture
def visit_at(browser, tmp_path):
    """Open a page on the API at a base URL (the session's, or a test's own server)."""
    opened: list[tuple[object, Visit]] = []

    def open_at(base_url: str) -> Visit:
        context = browser.new_context(
            viewport={"width": 1200, "height": 900}, accept_downloads=True
        )
        found = Visit(page=None, base_url=base_url, output=tmp_path)

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
        opened.append((context, found))
        return found

    yield open_at
    for number, (context, found) in enumerate(opened):
        shot = tmp_path / ("screenshot.png" if number == 0 else f"screenshot-{number}.png")
        found.page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
        context.close()


@pytest.fixture
def visit(visit_at, api_server):
    return visit_at(api_server.url)


# The page tests' own API (page_api): tiny-b offers every kind here, page-fresh is a model
# no job has run on (the estimate test writes its history), page-inpaint offers inpainting
# only (as a model with a dedicated inpainting UNet does).
PAGE_MODELS = """\
default_model = "tiny-b"

[models.tiny-b]
path = "{tiny}"
queue = "gpu.tiny-b"
dtype = "float32"
max_width = 128
max_height = 128
default_width = 64
default_height = 64
default_steps = 2
max_steps = 10

[models.page-fresh]
path = "{tiny}"
queue = "gpu.page-fresh"
dtype = "float32"
max_width = 128
max_height = 128
default_width = 64
default_height = 64
default_steps = 4
max_steps = 10

[models.page-inpaint]
path = "{tiny}"
queue = "gpu.page-inpaint"
dtype = "float32"
max_width = 128
max_height = 128
default_width = 64
default_height = 64
default_steps = 2
max_steps = 10
kinds = ["inpaint"]
"""
# Uploads past this are a 413 on page_api.
PAGE_INPUT_MAX_BYTES = 64 * 1024


@pytest.fixture(scope="session")
def page_api(stack, tmp_path_factory):
    """An API of the page tests' own: a cap of one queued job per tenant (for the 429),
    uploads of at most PAGE_INPUT_MAX_BYTES (for the 413) and PAGE_MODELS."""
    from testbed.processes import ApiServer

    models = tmp_path_factory.mktemp("page-api") / "models.toml"
    models.write_text(PAGE_MODELS.format(tiny=stack.tiny_model))
    env = {
        **stack.env,
        "DIFFQ_MODELS_FILE": str(models),
        "DIFFQ_MAX_QUEUED": "1",
        "DIFFQ_INPUT_MAX_BYTES": str(PAGE_INPUT_MAX_BYTES),
    }
    server = ApiServer(env, stack.logs, name="api-page").start()
    yield server
    server.stop()
