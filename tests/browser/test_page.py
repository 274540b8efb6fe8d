"""The page at /ui and the docs at /docs in a real browser, against the real stack."""

from __future__ import annotations

import io
import re
from urllib.parse import parse_qsl, urlsplit

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
    expect(page.locator("#estimate")).to_have_text(re.compile(r"^Expected time"))
    page.click("#submit-job")
    image = page.wait_for_selector("#job-images img")
    width = page.eval_on_selector("#job-images img", "img => img.complete && img.naturalWidth")
    assert width == 256
    # Shown at its own size, not squeezed into a grid column beside empty space.
    shown = page.eval_on_selector("#job-images img", "img => img.getBoundingClientRect().width")
    assert shown == 256, shown
    assert page.text_content("#job-state").startswith("Succeeded")
    # The form's expected time went with the submit: it does not stand beside the result.
    assert page.text_content("#estimate") == ""
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
    page.fill("#f-steps", "20")  # editing the form brings the estimate back
    expect(page.locator("#estimate")).to_have_text(re.compile(r"^Expected time: about"))
    visit.assert_clean()


def test_the_quality_picker_offers_the_models_tiers_and_sends_the_one_chosen(
    visit, worker, tenant_key
):
    page = visit.page
    visit.sign_in(tenant_key)
    expect(page.locator("#f-quality option")).to_have_count(3)
    offered = page.eval_on_selector_all("#f-quality option", "options => options.map(o => o.value)")
    assert offered == ["exact", "balanced", "fast"]
    assert page.input_value("#f-quality") == "exact"  # the model's default
    page.select_option("#f-quality", "fast")
    _fill(page, prompt="a windmill", steps=4, seed=2)
    page.click("#submit-job")
    page.wait_for_selector("#job-images img")
    job = _job(visit.base_url, tenant_key, _current_job_id(page))
    assert job["input"]["quality"] == "fast"
    assert job["result"]["manifest"]["quality"]["tier"] == "fast"
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


def test_without_a_key_the_form_says_what_to_do(visit):
    page = visit.page
    page.goto(f"{visit.base_url}/")
    expect(page.locator("#key-status code")).to_have_count(2)
    status = page.text_content("#key-status")
    assert "`" not in status, status
    assert "diffq up" in status and "diffq keys create" in status
    options = page.locator("#f-model option")
    expect(options).to_have_count(1)
    assert options.first.text_content() == "Enter an API key to load the models"
    for name in ("width", "height", "steps", "guidance_scale"):
        assert page.get_attribute(f"#f-{name}", "placeholder") == "model default", name
    assert "once a key is saved" in page.text_content("#hint-size")
    visit.assert_clean()


def test_recent_jobs_follow_the_watched_jobs_status(visit, worker, tenant_key, db):
    """Listed while it waits behind another job, the watched job's line says running
    once it runs, not the queued it was listed with."""
    page = visit.page
    visit.sign_in(tenant_key)
    _worker_idle(db)
    blocker = requests.post(
        f"{visit.base_url}/v1/jobs",
        json={"prompt": "ahead", "steps": 200, **LONG},
        headers=auth(tenant_key),
        timeout=10,
    ).json()
    expect_running = re.compile(r"^Running")
    try:
        _fill(page, prompt="behind", steps=400, **LONG)
        page.click("#submit-job")
        job_id = _current_job_id_of(page, "behind")
        line = page.locator(f"#job-list li[data-job-id='{job_id}'] .badge")
        expect(line).to_have_text("queued")
        expect(page.locator("#job-state")).to_have_text(expect_running, timeout=120_000)
        expect(line).to_have_text("running")
        page.click("#cancel-job")
        expect(line).to_have_text("canceled")
    finally:
        requests.post(blocker["urls"]["cancel"], headers=auth(tenant_key), timeout=10)
    visit.assert_clean()


def test_recent_jobs_page_back_with_the_cursor(visit, tenant_key):
    made = []
    for i in range(PAGE_SIZE + 3):  # queued on a model no worker serves, then canceled
        job = requests.post(
            f"{visit.base_url}/v1/jobs",
            json={"prompt": f"page {i}", "model": "tiny-b"},
            headers=auth(tenant_key),
            timeout=10,
        ).json()
        requests.post(job["urls"]["cancel"], headers=auth(tenant_key), timeout=10)
        made.append(job["id"])
    page = visit.page
    visit.sign_in(tenant_key)
    rows = page.locator("#job-list li")
    expect(rows).to_have_count(PAGE_SIZE)
    expect(page.locator("#more-jobs")).to_be_visible()
    page.click("#more-jobs")
    expect(rows).to_have_count(PAGE_SIZE + 3)
    expect(page.locator("#more-jobs")).to_be_hidden()
    shown = [rows.nth(i).get_attribute("data-job-id") for i in range(PAGE_SIZE + 3)]
    assert shown == list(reversed(made))  # newest first, each once
    visit.assert_clean()


PAGE_SIZE = 8  # app/web/ui/static/jobs.js
LONG = {"width": 256, "height": 192}
FRESH = "page-fresh"  # a model of page_api's (conftest.py) no job has run on


def _finished_job(db, seconds: float, **params) -> None:
    """A succeeded job of the fresh model, as a worker would have left it."""
    from datetime import timedelta

    from app.db.models.jobs import Job
    from app.db.types import utcnow
    from app.jobs import service
    from app.jobs.states import JobStatus, Priority
    from app.keys import get_or_create_tenant
    from testbed.factories import job_request

    with db.session() as session:
        tenant = get_or_create_tenant(session, "page-estimates")
        job = service.create_job(
            session,
            tenant.id,
            model=FRESH,
            queue=f"gpu.{FRESH}",
            priority=Priority.NORMAL,
            request=job_request(
                model=FRESH, prompt="history", **{"width": 64, "height": 64, "steps": 4, **params}
            ),
            metadata=None,
        )
        job = session.get(Job, job.id)
        job.status = JobStatus.SUCCEEDED
        job.finished_at = utcnow()
        job.started_at = job.finished_at - timedelta(seconds=seconds)
        session.commit()


def test_the_expected_time_says_how_sure_it_is(visit_at, page_api, tenant_key, db):
    visit = visit_at(page_api.url)
    page = visit.page
    visit.sign_in(tenant_key)
    page.select_option("#f-model", FRESH)
    estimate = page.locator("#estimate")
    expect(estimate).to_have_text(
        "Expected time: not known yet (no job has finished on this model)."
    )
    _finished_job(db, 12.0)  # one job of 64 x 64, 4 steps, in 12 s
    page.fill("#f-steps", "4")
    expect(estimate).to_have_text(
        re.compile(
            r"^Expected time: about \d+ s\. A rough guess: it rests on 1 finished job on "
            r"this model\.$"
        )
    )
    _finished_job(db, 36.0, width=128, height=128)
    _finished_job(db, 24.0, width=128, height=64)
    page.fill("#f-width", "128")
    page.fill("#f-height", "128")
    expect(estimate).to_have_text(re.compile(r"^Expected time: about \d+ s\.$"))
    visit.assert_clean()


def _estimate_asking(**wanted: str):
    """A request predicate: an estimate asked with these query values."""

    def asking(request) -> bool:
        query = dict(parse_qsl(urlsplit(request.url).query))
        return "/estimate" in request.url and all(query.get(k) == v for k, v in wanted.items())

    return asking


def test_the_estimate_asks_for_the_chosen_tier_and_guidance(visit, tenant_key):
    """A tier is estimated at its share of the work (a guidance cut runs fewer rows), and
    the guidance says whether there is any to cut: the page asks again, with both, when
    either changes."""
    page = visit.page
    visit.sign_in(tenant_key)
    page.select_option("#f-model", "tiny")
    expect(page.locator("#estimate")).to_have_text(re.compile(r"^Expected time"))
    with page.expect_request(_estimate_asking(quality="fast")):
        page.select_option("#f-quality", "fast")
    with page.expect_request(_estimate_asking(quality="fast", guidance_scale="1")):
        page.fill("#f-guidance_scale", "1")
    expect(page.locator("#estimate")).to_have_text(re.compile(r"^Expected time"))
    visit.assert_clean()


def test_a_429_counts_down_its_retry_after_with_submit_off(visit_at, page_api, tenant_key):
    first = requests.post(
        f"{page_api.url}/v1/jobs", json={"prompt": "fills the cap"}, headers=auth(tenant_key)
    )
    assert first.status_code == 202, first.text
    visit = visit_at(page_api.url)
    page = visit.page
    try:
        visit.sign_in(tenant_key)
        page.click("#submit-job")
        notice = page.locator("#notice")
        expect(notice).to_have_text(re.compile(r"Too many queued jobs.*Try again in \d+ s\."))
        first_left = int(re.search(r"again in (\d+) s", notice.text_content()).group(1))
        assert page.is_disabled("#submit-job")
        expect(notice).to_have_text(re.compile(rf"again in {first_left - 2} s\."))
        assert page.is_disabled("#submit-job")
        expect(notice).to_be_hidden(timeout=(first_left + 5) * 1000)
        assert page.is_enabled("#submit-job")
        listed = requests.get(f"{page_api.url}/v1/jobs", headers=auth(tenant_key), timeout=10)
        assert [j["id"] for j in listed.json()["data"]] == [first.json()["id"]]
    finally:
        requests.post(first.json()["urls"]["cancel"], headers=auth(tenant_key), timeout=10)
    visit.assert_clean()


def _current_job_id_of(page, prompt: str) -> str:
    row = page.locator("#job-list li", has_text=prompt).first
    expect(row).to_be_attached()
    return row.get_attribute("data-job-id")


def _worker_idle(db) -> None:
    from sqlalchemy import func, select

    from app.db.models.jobs import Job
    from app.jobs.states import JobStatus
    from testbed.waiting import wait_until

    def idle() -> bool:
        with db.session() as session:
            return not session.scalar(
                select(func.count())
                .select_from(Job)
                .where(
                    Job.queue == "gpu.tiny",
                    Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]),
                )
            )

    wait_until(idle, timeout=120, interval=0.2)
