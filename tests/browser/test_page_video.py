"""The page's Video mode in a real browser, against the real stack: the tiny LTX-Video model
chosen, a clip from the prompt alone or from a first image the person picks, its progress,
then an HTML5 player that Chromium plays (its duration frames / fps, its size), and the MP4
downloaded."""

from __future__ import annotations

import hashlib
import io
import re
from urllib.parse import urlparse

import numpy as np
import pytest
import requests
from PIL import Image

from testbed.jobs import auth

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'"
)
expect = sync_api.expect
expect.set_options(timeout=120_000)

pytestmark = [pytest.mark.services, pytest.mark.browser]

MODEL = "tiny-video"  # family ltx: 8k + 1 frames, sizes multiples of 32 (testbed/stack.py)
FRAMES, FPS = 9, 24
H264 = 'video/mp4; codecs="avc1.42E01E"'  # H.264 Constrained Baseline, as libx264 writes it
# A <video>'s readyState at HAVE_CURRENT_DATA: the frame at the current position is decoded.
HAVE_CURRENT_DATA = 2
STEPS = 20  # tiny-video's max_steps

# Records every text the job's state line takes (its progress, step by step), each one
# even where several are set in one task (events read in one chunk of the stream).
RECORD_STATES = """
window.jobStates = [];
document.addEventListener("DOMContentLoaded", () => {
  const state = document.getElementById("job-state");
  new MutationObserver((records) => {
    for (const record of records) {
      for (const node of record.addedNodes) window.jobStates.push(node.textContent);
    }
  }).observe(state, { childList: true });
});
"""
# Until the player has decoded the frame at its position (or says why it cannot). A function,
# not an expression: Playwright evals the text once, through the DevTools protocol, then
# calls the function on each animation frame; an expression would be eval'd on every frame,
# which the page's CSP refuses (no 'unsafe-eval').
PLAYER = "#job-images video"
PLAYED = f"""() => {{
  const video = document.querySelector("{PLAYER}");
  return Boolean(video && (video.readyState >= {HAVE_CURRENT_DATA} || video.error));
}}"""
# Once played: its time moved on (or, the clip being short, it ended).
PLAYING = f"""() => {{
  const video = document.querySelector("{PLAYER}");
  return video.ended || video.currentTime > 0;
}}"""


def _png(size: tuple[int, int], seed: int = 1) -> bytes:
    rng = np.random.default_rng(seed)
    width, height = size
    ramp = np.linspace(0, 255, width)[None, :, None]
    noise = rng.integers(0, 48, (height, width, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(ramp * 0.8 + noise, 0, 255).astype(np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _jobs(base_url: str, key: str) -> list[dict]:
    return requests.get(f"{base_url}/v1/jobs", headers=auth(key), timeout=10).json()["data"]


def _choose_video_model(page) -> None:
    page.select_option("#f-model", MODEL)
    # The model offers video only: the image modes go and the form moves to Video.
    for other in ("txt2img", "img2img", "inpaint"):
        expect(page.locator(f"#f-kind-{other}")).to_be_hidden()
    page.check("#f-kind-video")
    expect(page.locator("#video-part")).to_be_visible()
    expect(page.locator("#create-heading")).to_have_text("New video")
    expect(page.locator("#num-images-part")).to_be_hidden()  # a job makes one clip
    expect(page.locator("#hint-num_frames")).to_contain_text("k \u00d7 8 + 1")


def _can_play_h264(page) -> str:
    answer = page.evaluate(f"document.createElement('video').canPlayType({H264!r})")
    print(f"chromium canPlayType({H264}) = {answer!r}")
    return answer


def _played(page, job: dict, size: tuple[int, int]) -> dict:
    """Wait until the player has the current frame decoded, and say what it reads."""
    player = page.locator(PLAYER)
    expect(player).to_have_count(1)
    page.wait_for_function(PLAYED)
    shown = player.evaluate(
        """v => ({readyState: v.readyState, duration: v.duration, videoWidth: v.videoWidth,
                  videoHeight: v.videoHeight, error: v.error && v.error.message,
                  src: v.getAttribute("src"), poster: v.getAttribute("poster"),
                  controls: v.controls, playsinline: v.hasAttribute("playsinline"),
                  preload: v.getAttribute("preload")})"""
    )
    print(f"player: {shown}")
    assert shown["error"] is None, shown
    assert shown["readyState"] >= HAVE_CURRENT_DATA, shown
    [video] = job["result"]["videos"]
    [poster] = job["result"]["images"]
    # The same files the API names (each URL signed anew when read: the paths compare).
    assert urlparse(shown["src"]).path == urlparse(video["url"]).path
    assert urlparse(shown["poster"]).path == urlparse(poster["url"]).path
    assert shown["controls"] and shown["playsinline"] and shown["preload"] == "auto"
    assert abs(shown["duration"] - FRAMES / FPS) < 0.1, shown
    assert (shown["videoWidth"], shown["videoHeight"]) == size, shown
    # And it runs: played (muted, as a page may without a click), its time moves on.
    page.evaluate(
        f"() => {{ const v = document.querySelector({PLAYER!r}); v.muted = true; v.play(); }}"
    )
    page.wait_for_function(PLAYING)
    return shown


def _downloads_the_mp4(visit, job: dict) -> None:
    page = visit.page
    [video] = job["result"]["videos"]
    link = page.locator("#job-images figure.clip a.download")
    expect(link).to_contain_text("Download the MP4")
    with page.expect_download() as download:
        link.click()
    saved = visit.output / download.value.suggested_filename
    download.value.save_as(saved)
    assert saved.name == f"diffq-{job['id']}-0.mp4"
    data = saved.read_bytes()
    assert len(data) == video["bytes"]
    assert hashlib.sha256(data).hexdigest() == video["sha256"]
    assert data[4:8] == b"ftyp"


def _finished(visit, key: str) -> dict:
    page = visit.page
    expect(page.locator("#job-state")).to_have_text(re.compile(r"^(Succeeded|Failed|Canceled)"))
    [job] = _jobs(visit.base_url, key)
    assert job["status"] == "succeeded", job  # a failure: see the stack's worker-tiny-video log
    return job


def test_a_clip_from_the_prompt_plays_in_the_page(visit, video_worker, tenant_key):
    page = visit.page
    page.add_init_script(RECORD_STATES)
    visit.sign_in(tenant_key)
    can_play = _can_play_h264(page)
    _choose_video_model(page)
    assert page.is_checked("#f-kind-txt2vid")
    expect(page.locator("#image-part")).to_be_hidden()  # from the prompt: no image to pick
    page.fill("#f-prompt", "waves rolling onto a beach")
    page.fill("#f-num_frames", str(FRAMES))
    page.fill("#f-fps", str(FPS))
    page.fill("#f-width", "64")
    page.fill("#f-height", "64")
    # The model's most steps: long enough for progress writes while it denoises.
    page.fill("#f-steps", str(STEPS))
    page.fill("#f-seed", "3")
    expect(page.locator("#hint-clip")).to_have_text("9 frames at 24 fps: a 0.38 s clip.")
    page.click("#submit-job")

    job = _finished(visit, tenant_key)
    states = page.evaluate("window.jobStates")
    print(f"job states shown: {states}")
    assert job["input"]["kind"] == "txt2vid"
    assert (job["input"]["num_frames"], job["input"]["fps"]) == (FRAMES, FPS)
    [video] = job["result"]["videos"]
    assert (video["frames"], video["fps"], video["width"], video["height"]) == (9, 24, 64, 64)
    assert job["result"]["images"][0]["poster"] is True
    caption = page.text_content("#job-images figure.clip figcaption")
    assert "seed 3" in caption and "9 frames at 24 fps (0.38 s)" in caption, caption
    # Progress as for an image, live: its stages while it ran, each denoising step shown
    # counted. (The tiny model may denoise all its steps within one progress write interval,
    # DIFFQ_PROGRESS_INTERVAL: then no step is written, and none is shown.)
    running = [state for state in states if state.startswith("Running: ")]
    assert running, states
    denoising = [state for state in running if state.startswith("Running: denoising")]
    step = re.compile(rf"^Running: denoising, step \d+ of {STEPS}\.$")
    assert all(step.match(state) for state in denoising), denoising
    assert page.get_attribute("#job-progress", "value") == "100"

    if not can_play:
        # The MP4 is there (downloaded below); only this Chromium cannot decode H.264.
        _downloads_the_mp4(visit, job)
        visit.assert_clean()
        pytest.xfail(f"this Chromium cannot play H.264: canPlayType({H264}) is ''")
    _played(page, job, (64, 64))
    _downloads_the_mp4(visit, job)
    # The recent jobs show the clip's poster as its thumbnail.
    expect(page.locator("#job-list li[data-status=succeeded] .thumb img")).to_have_count(1)
    visit.assert_clean()


def test_a_clip_from_a_first_image_the_person_picks(visit, video_worker, tenant_key, tmp_path):
    page = visit.page
    page.add_init_script(RECORD_STATES)
    uploads: list = []

    def record(response) -> None:
        if response.request.method == "POST" and response.url.endswith("/v1/uploads"):
            uploads.append(response)

    page.on("response", record)
    visit.sign_in(tenant_key)
    can_play = _can_play_h264(page)
    _choose_video_model(page)
    page.check("#f-kind-img2vid")
    expect(page.locator("#image-part")).to_be_visible()
    expect(page.locator("#strength-part")).to_be_hidden()  # the first frame is kept as it is
    expect(page.locator("#f-mask")).to_be_hidden()
    assert page.get_attribute("#f-width", "placeholder") == "the input's"
    first = tmp_path / "first.png"
    first.write_bytes(_png((96, 64)))
    page.set_input_files("#f-image", str(first))
    expect(page.locator("#hint-image")).to_have_text("first.png: 96 \u00d7 64 px.")
    fitted = "the input's size within these: 96 \u00d7 64."
    expect(page.locator("#hint-size")).to_contain_text(fitted)
    page.fill("#f-prompt", "the camera pans right")
    page.fill("#f-num_frames", str(FRAMES))
    page.fill("#f-fps", str(FPS))
    page.fill("#f-steps", "2")
    page.fill("#f-seed", "4")
    page.click("#submit-job")

    job = _finished(visit, tenant_key)
    assert job["input"]["kind"] == "img2vid"
    [upload] = [u.json() for u in uploads]
    assert job["input"]["image"] == upload["sha256"]
    assert "strength" not in job["input"] or job["input"]["strength"] is None
    assert (job["input"]["width"], job["input"]["height"]) == (96, 64)  # the input's own
    # The first image beside the clip.
    expect(page.locator("#job-images figure.input img")).to_be_visible()
    expect(page.locator("#job-images figure.clip video")).to_be_visible()

    if not can_play:
        _downloads_the_mp4(visit, job)
        visit.assert_clean()
        pytest.xfail(f"this Chromium cannot play H.264: canPlayType({H264}) is ''")
    _played(page, job, (96, 64))
    _downloads_the_mp4(visit, job)

    # "Same again" sends the same first image (by its upload's id), frames and rate.
    page.click("#same-again")
    expect(page.locator("#job-list li")).to_have_count(2)
    again, done = _jobs(visit.base_url, tenant_key)
    assert done["id"] == job["id"]
    for name in ("kind", "image", "num_frames", "fps", "seed", "steps", "width", "height"):
        assert again["input"][name] == done["input"][name], name
    visit.assert_clean()
