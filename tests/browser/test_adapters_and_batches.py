"""The page's adapters (LoRA) and batches in a real browser, against the real API and
worker: an adapter uploaded and picked in the form and recorded in the job it ran with;
a JSON Lines batch run to its end, its results downloaded, another cancelled; and the
page without a key saying that one is needed (not that it was refused)."""

from __future__ import annotations

import json
import re

import pytest
import requests

from testbed.jobs import auth
from workers.tiny import build_tiny_lora

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'"
)
expect = sync_api.expect
expect.set_options(timeout=60_000)

pytestmark = [pytest.mark.services, pytest.mark.browser]

# Records every value the batch's progress bar takes (a <progress> reflects .value to its
# attribute).
RECORD_BATCH_PROGRESS = """
window.batchProgress = [];
document.addEventListener("DOMContentLoaded", () => {
  const bar = document.getElementById("batch-progress");
  new MutationObserver(() => window.batchProgress.push([Number(bar.value), Number(bar.max)]))
    .observe(bar, { attributes: true, attributeFilter: ["value", "max"] });
});
"""
FIRST_ROW = "#lora-list li:nth-child(1)"
SKUS = ["sku-1", "sku-2", "sku-3"]


def _get(base_url: str, key: str, path: str):
    response = requests.get(f"{base_url}{path}", headers=auth(key), timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _posted_jobs(page) -> list[dict]:
    """The bodies of the page's POST /v1/jobs, as sent."""
    sent: list[dict] = []

    def record(request) -> None:
        if request.method == "POST" and request.url.endswith("/v1/jobs"):
            sent.append(request.post_data_json)

    page.on("request", record)
    return sent


def test_an_adapter_uploaded_on_the_page_runs_with_the_job(visit, worker, tenant_key, tmp_path):
    page = visit.page
    sent = _posted_jobs(page)
    visit.sign_in(tenant_key)
    expect(page.locator("#hint-loras")).to_have_text(re.compile(r"^At most 2 for tiny"))
    assert page.is_enabled("#add-lora")

    # A file that is no safetensors: the API's 422 beside the upload, nothing stored.
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"not a safetensors file at all")
    page.set_input_files("#f-adapter-file", str(broken))
    expect(page.locator("#err-adapter-file")).not_to_be_empty()
    assert page.get_attribute("#f-adapter-file", "aria-invalid") == "true"
    assert _get(visit.base_url, tenant_key, "/v1/adapters")["data"] == []

    lora = tmp_path / "watercolor.safetensors"
    lora.write_bytes(build_tiny_lora(31))
    page.set_input_files("#f-adapter-file", str(lora))
    expect(page.locator("#hint-adapter-file")).to_contain_text("watercolor: rank 4")
    expect(page.locator("#err-adapter-file")).to_be_empty()
    assert page.get_attribute("#f-adapter-file", "aria-invalid") is None
    (adapter,) = _get(visit.base_url, tenant_key, "/v1/adapters")["data"]
    assert (adapter["name"], adapter["model"]) == ("watercolor", "tiny")
    expect(page.locator("#lora-list li")).to_have_count(1)
    picker = page.locator(f"{FIRST_ROW} select")
    expect(picker).to_have_value(f"id:{adapter['id']}")
    assert "ink (shared)" in picker.locator("option").all_text_contents()

    # A scale past 2: the API's 422 beside the adapters, on the scale, nothing queued.
    page.fill("#f-prompt", "a harbour in watercolour")
    page.fill("#f-steps", "2")
    page.fill("#f-seed", "3")
    page.fill(f"{FIRST_ROW} input", "5")
    page.click("#submit-job")
    expect(page.locator("#err-loras")).to_contain_text("Adapter 1, scale:")
    assert page.get_attribute(f"{FIRST_ROW} input", "aria-invalid") == "true"
    assert page.evaluate("document.activeElement.className") == "lora-scale"
    assert _get(visit.base_url, tenant_key, "/v1/jobs")["data"] == []

    # The estimate counts the adapter; the job runs with it.
    with page.expect_request(lambda r: "/estimate?" in r.url and "loras=1" in r.url):
        page.fill(f"{FIRST_ROW} input", "0.8")
    page.click("#submit-job")
    expect(page.locator("#job-state")).to_have_text(re.compile(r"^Succeeded"))
    expect(page.locator("#err-loras")).to_be_empty()
    expect(page.locator("#job-images figcaption")).to_contain_text("LoRA watercolor \u00d7 0.8")
    assert sent[-1]["loras"] == [{"id": adapter["id"], "scale": 0.8}]
    (job,) = _get(visit.base_url, tenant_key, "/v1/jobs")["data"]
    stored = [{"sha256": adapter["sha256"], "scale": 0.8}]
    assert job["status"] == "succeeded"
    assert job["input"]["loras"] == stored
    assert job["result"]["manifest"]["loras"] == stored

    # "Same again" sends the adapter again, by its id.
    page.click("#same-again")
    expect(page.locator("#job-list li")).to_have_count(2)
    assert sent[-1]["loras"] == [{"id": adapter["id"], "scale": 0.8}]
    newer = _get(visit.base_url, tenant_key, "/v1/jobs")["data"][0]
    assert newer["input"]["loras"] == stored

    # A model that takes no adapters: none offered, and it says so.
    page.select_option("#f-model", "tiny-b")
    expect(page.locator("#hint-loras")).to_have_text("tiny-b takes no adapters.")
    expect(page.locator("#lora-part")).to_be_hidden()
    visit.assert_clean()


def test_a_batch_uploaded_on_the_page_runs_to_the_end_and_its_results_download(
    visit, worker, tenant_key, tmp_path
):
    page = visit.page
    page.add_init_script(RECORD_BATCH_PROGRESS)
    visit.sign_in(tenant_key)
    expect(page.locator("#batch-none")).to_be_visible()

    # A line without its prompt refuses the whole batch, said beside the file.
    bad = [{"custom_id": "a", "prompt": "fine", "steps": 2}, {"custom_id": "b", "steps": 2}]
    page.set_input_files("#f-batch-file", _jsonl(tmp_path / "bad.jsonl", bad))
    page.click("#submit-batch")
    expect(page.locator("#err-batch-file")).to_contain_text("Line 2: prompt:")
    assert page.get_attribute("#f-batch-file", "aria-invalid") == "true"
    assert _get(visit.base_url, tenant_key, "/v1/batches")["data"] == []

    rows = [
        {"custom_id": sku, "prompt": f"a sneaker, {sku}", "steps": 2, "seed": n}
        for n, sku in enumerate(SKUS, 1)
    ]
    page.set_input_files("#f-batch-file", _jsonl(tmp_path / "prompts.jsonl", rows))
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/v1/batches")) as r:
        page.click("#submit-batch")
    assert r.value.headers["content-type"] == "application/jsonl"
    expect(page.locator("#err-batch-file")).to_be_empty()
    expect(page.locator("#batch-state")).to_have_text("Completed.")
    bar = page.locator("#batch-progress")
    expect(bar).to_have_attribute("max", "3")
    expect(bar).to_have_attribute("value", "3")
    expect(page.locator("#batch-counts")).to_have_text("3 of 3 requests ended: 3 succeeded.")
    seen = page.evaluate("window.batchProgress")
    print(f"batch progress seen: {seen}")
    values = [value for value, _ in seen]
    assert values == sorted(values) and seen[-1] == [3, 3], seen
    assert page.is_hidden("#cancel-batch")

    (batch,) = _get(visit.base_url, tenant_key, "/v1/batches")["data"]
    assert batch["status"] == "completed" and batch["counts"]["succeeded"] == 3
    expect(page.locator("#batch-name")).to_have_text(f"Batch {batch['id']}")
    line = page.locator(f"#batch-list li[data-batch-id='{batch['id']}'] .badge")
    expect(line).to_have_text("completed")

    with page.expect_download() as download:
        page.click("#batch-results")
    assert download.value.suggested_filename == f"diffq-batch-{batch['id']}-results.jsonl"
    saved = visit.output / download.value.suggested_filename
    download.value.save_as(saved)
    results = [json.loads(text) for text in saved.read_text().splitlines()]
    assert [row["custom_id"] for row in results] == SKUS
    assert [row["line"] for row in results] == [1, 2, 3]
    jobs = {job["id"]: job for job in _get(visit.base_url, tenant_key, "/v1/jobs")["data"]}
    for row, asked in zip(results, rows, strict=True):
        assert row["status"] == "succeeded", row
        assert len(row["images"]) == 1 and row["images"][0]["url"]
        assert jobs[row["job_id"]]["input"]["seed"] == asked["seed"]
    visit.assert_clean()


def test_a_batch_cancelled_on_the_page_ends_cancelled(visit, worker, tenant_key, tmp_path):
    page = visit.page
    visit.sign_in(tenant_key)
    rows = [
        {"custom_id": sku, "prompt": "a slow one", "steps": 500, "width": 256, "height": 192}
        for sku in SKUS
    ]
    page.set_input_files("#f-batch-file", _jsonl(tmp_path / "slow.jsonl", rows))
    page.click("#submit-batch")
    expect(page.locator("#batch-state")).to_have_text("In progress.")
    expect(page.locator("#batch-progress")).to_have_attribute("max", "3")
    page.click("#cancel-batch")
    expect(page.locator("#batch-state")).to_have_text("Cancelled.")
    expect(page.locator("#batch-counts")).to_have_text("3 of 3 requests ended: 3 canceled.")
    expect(page.locator("#batch-progress")).to_have_attribute("value", "3")
    assert page.is_hidden("#cancel-batch") and page.is_visible("#batch-results")

    (batch,) = _get(visit.base_url, tenant_key, "/v1/batches")["data"]
    assert batch["status"] == "cancelled", batch
    assert batch["counts"]["canceled"] == 3 and batch["counts"]["succeeded"] == 0
    line = page.locator(f"#batch-list li[data-batch-id='{batch['id']}'] .badge")
    expect(line).to_have_text("cancelled")
    jobs = _get(visit.base_url, tenant_key, "/v1/jobs")["data"]
    assert sorted(job["status"] for job in jobs) == ["canceled"] * 3
    visit.assert_clean()


def test_without_a_key_the_page_says_one_is_needed_not_refused(visit, tmp_path):
    page = visit.page
    calls: list[str] = []
    page.on("request", lambda r: "/v1/" in r.url and calls.append(f"{r.method} {r.url}"))
    page.goto(f"{visit.base_url}/")
    status = page.locator("#key-status")
    needed = re.compile(r"^An API key is needed first")
    expect(status).to_contain_text("Enter an API key")

    page.click("#submit-job")
    expect(status).to_have_text(needed)
    expect(page.locator("#key-status code")).to_have_count(2)
    assert "refused" not in status.text_content()
    assert page.evaluate("document.activeElement.id") == "api-key"
    assert page.is_hidden("#notice")

    # The same for a batch and for an adapter.
    page.set_input_files(
        "#f-batch-file", _jsonl(tmp_path / "one.jsonl", [{"custom_id": "a", "prompt": "x"}])
    )
    page.click("#submit-batch")
    expect(status).to_have_text(needed)
    lora = tmp_path / "style.safetensors"
    lora.write_bytes(b"never sent")
    page.set_input_files("#f-adapter-file", str(lora))
    expect(status).to_have_text(needed)
    assert "refused" not in status.text_content()
    assert calls == []  # nothing is sent without a key

    # A key that was given and refused by the API is said to be refused.
    page.fill("#api-key", "dq_not_a_key")
    page.click("#key-form button[type=submit]")
    expect(status).to_have_text("The API key was refused; enter a valid one.")
    assert calls, "the key was sent"

    # Forgotten again: needed, not refused.
    page.click("#forget-key")
    page.click("#submit-job")
    expect(status).to_have_text(needed)
    visit.assert_clean()
