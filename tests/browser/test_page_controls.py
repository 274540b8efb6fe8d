"""The page's ControlNet part in a real browser, against the real API and worker: the
model's ControlNets offered, a control image uploaded and previewed as the edges its
ControlNet reads, the job sent with its control and run with it; a model without any
says so."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import requests
from PIL import Image

from testbed.jobs import auth
from testbed.stack import build_tiny_controlnet

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'"
)
expect = sync_api.expect
expect.set_options(timeout=60_000)

pytestmark = [pytest.mark.services, pytest.mark.browser]


def test_a_control_image_is_previewed_as_its_edges_and_runs_with_the_job(
    visit, worker, tenant_key, tmp_path, stack
):
    build_tiny_controlnet(stack)
    page = visit.page
    sent: list[dict] = []
    page.on(
        "request",
        lambda r: (
            sent.append(r.post_data_json)
            if r.method == "POST" and r.url.endswith("/v1/jobs")
            else None
        ),
    )
    visit.sign_in(tenant_key)
    expect(page.locator("#control-part")).to_be_visible()
    assert page.locator("#f-controlnet option").all_text_contents() == ["None", "tiny-canny"]
    # The estimate counts the control (each adds 0.4 to the work) as soon as it is chosen.
    with page.expect_request(lambda r: "/estimate?" in r.url and "controls=1" in r.url):
        page.select_option("#f-controlnet", "tiny-canny")

    layout = Image.new("RGB", (64, 64), (15, 15, 15))
    layout.paste((240, 160, 30), (16, 12, 48, 52))
    layout.save(tmp_path / "layout.png")
    page.set_input_files("#f-control-image", str(tmp_path / "layout.png"))
    expect(page.locator("#hint-control-image")).to_contain_text("64 \u00d7 64 px")
    preview = page.locator("#control-preview")
    expect(preview).to_be_visible()
    expect(preview).to_have_attribute("alt", re.compile("edges"))
    drawn = Image.open(io.BytesIO(preview.screenshot())).convert("L").resize((64, 64))
    print(f"preview: {len(np.unique(np.asarray(drawn)))} grey levels shown")
    shown = np.asarray(drawn)
    assert shown[32, 32] < 60 and shown.max() > 200  # dark inside, bright edges

    page.fill("#f-prompt", "a lighthouse")
    page.fill("#f-steps", "2")
    page.fill("#f-control-scale", "0.7")
    page.click("#submit-job")
    expect(page.locator("#job-state")).to_have_text(re.compile(r"^Succeeded"))
    [control] = sent[-1]["controls"]
    assert (control["controlnet"], control["scale"], control["preprocess"]) == (
        "tiny-canny",
        0.7,
        "canny",
    )
    jobs = requests.get(f"{visit.base_url}/v1/jobs", headers=auth(tenant_key), timeout=10)
    [job] = jobs.json()["data"]
    assert job["status"] == "succeeded" and job["result"]["manifest"]["controls"][0]["scale"] == 0.7

    # A model that takes no ControlNet says so, and offers none.
    page.select_option("#f-model", "tiny-b")
    expect(page.locator("#hint-controls")).to_have_text("tiny-b takes no ControlNet.")
    expect(page.locator("#control-part")).to_be_hidden()
    visit.assert_clean()
