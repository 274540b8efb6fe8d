"""The page at /ui and the docs at /docs in a real browser, against the real stack."""

from __future__ import annotations

import io
import re

import pytest
import requests
from PIL import Image

from testbed.jobs import auth

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'"
)
expect = sync_api.expect
expect.set_options(timeout=60_000)

pytestmark = [pytest.mark.services, pytest.mark.browser]

XSS = "<img src=x onerror=alert(1)>"
# Records every value the progress bar takes (a <progress> reflects .value to its attribute).
RECORD_PROGRESS = """
window.progressSeen = [];
document.addEventListener("DOMContentLoaded", () => {
  const bar = document.getElementById("job-progress");
  new MutationObserver(() => window.progressSeen.push(Number(bar.value)))
    .observe(bar, { attributes: true, attributeFilter: ["value"] });
});
"""


def _fill(page, **fields) -> None:
    for name, value in fields.items():
        page.fill(f"#f-{name}", str(value))


def _job(base_url: str, key: str, job_id: str) -> dict:
    return requests.get(f"{base_url}/v1/jobs/{job_id}", headers=auth(key), timeout=10).json()


def _current_job_id(page) -> str:
    page.wait_for_selector("#job-list li[data-job-id]")
    return page.get_attribute("#job-list li:first-child", "data-job-id")


def test_submit_shows_progress_then_the_image_and_downloads_it(visit, worker, tenant_key):
    page = visit.page
    page.add_init_script(RECORD_PROGRESS)
    visit.sign_in(tenant_key)
    # Long enough for several progress writes on a fast core (as the SSE test's job is).
    _fill(page, prompt="a lighthouse at dusk", width=256, height=192, steps=40, seed=7)
    page.click("#submit-job")
    image = page.wait_for_selector("#job-images img")
    width = page.eval_on_selector("#job-images img", "img => img.complete && img.naturalWidth")
    assert width == 256
    assert page.text_content("#job-state").startswith("Succeeded")
    seen = page.evaluate("window.progressSeen")
    steps = [v for v in seen if 0 < v < 100]
    print(f"progress values seen: {seen}")
    assert len(set(steps)) >= 2, seen  # it moved while running, not only at the end
    assert seen == sorted(seen) and seen[-1] == 100
    assert "seed 7" in page.text_content("#job-images figcaption")

    with page.expect_download() as download:
        page.click("#job-images button.download")
    saved = visit.output / download.value.suggested_filename
    download.value.save_as(saved)
    job = _job(visit.base_url, tenant_key, _current_job_id(page))
    assert saved.name == f"diffq-{job['id']}-0.png"
    assert saved.stat().st_size == job["result"]["images"][0]["bytes"]
    assert Image.open(io.BytesIO(saved.read_bytes())).size == (256, 192)
    assert image.is_visible()
    visit.assert_clean()


def test_cancel_stops_a_running_job(visit, worker, tenant_key):
    page = visit.page
    visit.sign_in(tenant_key)
    _fill(page, prompt="a very long job", steps=500)
    page.click("#submit-job")
    # Locators, not wait_for_function: the page's CSP forbids the eval that one needs.
    expect(page.locator("#job-state")).to_have_text(re.compile(r"^Running: denoising"))
    page.click("#cancel-job")
    expect(page.locator("#job-state")).to_have_text("Canceled.")
    job = _job(visit.base_url, tenant_key, _current_job_id(page))
    print(f"canceled at {job['progress']}")
    assert job["status"] == "canceled"
    assert job["progress"]["step"] < 500
    assert page.is_hidden("#cancel-job") and page.is_visible("#same-again")
    visit.assert_clean()


def test_a_422_is_shown_beside_the_field_it_names(visit, tenant_key):
    page = visit.page
    visit.sign_in(tenant_key)
    _fill(page, prompt="too much guidance", guidance_scale=99)
    page.click("#submit-job")
    page.wait_for_selector("#err-guidance_scale:not(:empty)")
    assert "Must be between 0 and" in page.text_content("#err-guidance_scale")
    assert page.get_attribute("#f-guidance_scale", "aria-invalid") == "true"
    assert page.evaluate("document.activeElement.id") == "f-guidance_scale"
    assert page.text_content("#err-prompt") == ""
    listed = requests.get(f"{visit.base_url}/v1/jobs", headers=auth(tenant_key), timeout=10)
    assert listed.json()["data"] == []  # the API refused it; nothing was queued
    visit.assert_clean()


def test_a_prompt_with_markup_renders_as_text(visit, worker, tenant_key):
    page = visit.page
    visit.sign_in(tenant_key)
    _fill(page, prompt=XSS, steps=2)
    page.click("#submit-job")
    page.wait_for_selector("#job-images img")
    page.wait_for_selector("#job-list li[data-status=succeeded]")
    assert page.text_content("#job-prompt") == XSS
    assert page.text_content("#job-list .job-prompt") == XSS
    assert page.locator("img[src='x']").count() == 0
    assert visit.dialogs == []

    page.click("#new-seed")  # the same request again, with a seed of the API's choosing
    expect(page.locator("#job-list li")).to_have_count(2)
    listed = requests.get(f"{visit.base_url}/v1/jobs", headers=auth(tenant_key), timeout=10)
    newer, older = listed.json()["data"]
    assert newer["input"]["prompt"] == older["input"]["prompt"] == XSS
    assert newer["input"]["steps"] == 2 and newer["input"]["seed"] != older["input"]["seed"]
    visit.assert_clean()


def test_docs_render_every_operation_with_the_network_blocked(visit):
    page = visit.page
    spec = requests.get(f"{visit.base_url}/openapi.json", timeout=10).json()
    verbs = {"get", "post", "put", "patch", "delete"}
    operations = sum(len(verbs & set(methods)) for methods in spec["paths"].values())
    assert operations >= 13
    page.goto(f"{visit.base_url}/docs")
    expect(page.locator(".opblock")).to_have_count(operations)
    assert page.locator(".opblock-summary-path", has_text="/v1/models/{name}/estimate").count()
    visit.assert_clean()
