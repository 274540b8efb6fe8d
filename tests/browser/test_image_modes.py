"""The page's image to image and inpainting modes in a real browser, against the real stack:
an image chosen or dropped, the mask painted with the mouse, the strength slider, and
what the API was sent (the job's kind and strength, the mask upload's pixels)."""

from __future__ import annotations

import base64
import hashlib
import io
import re
from urllib.parse import parse_qs, urlparse

import numpy as np
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

SIZE = (128, 96)  # the input image; the tiny model's limits take it as it is
SHOWN_SIZE = "128 \u00d7 96"  # as the page writes a size


def _picture(seed: int, size=SIZE) -> Image.Image:
    """A gradient under noise: any redrawing shows."""
    rng = np.random.default_rng(seed)
    width, height = size
    ramp = np.linspace(0, 255, width, dtype=np.float64)[None, :, None]
    noise = rng.integers(0, 64, (height, width, 3))
    return Image.fromarray(np.clip(ramp * 0.7 + noise, 0, 255).astype(np.uint8))


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _jobs(base_url: str, key: str) -> list[dict]:
    return requests.get(f"{base_url}/v1/jobs", headers=auth(key), timeout=10).json()["data"]


def _recorded_uploads(page) -> list:
    """The page's POST /v1/uploads answers, as they come."""
    seen: list = []

    def record(response) -> None:
        if response.request.method == "POST" and response.url.endswith("/v1/uploads"):
            seen.append(response)

    page.on("response", record)
    return seen


def _drag(page, canvas, points, size=SIZE) -> None:
    """Mouse down at the first point (image pixels), through the others, up at the last."""
    box = canvas.bounding_box()

    def screen(x: float, y: float) -> tuple[float, float]:
        return box["x"] + x * box["width"] / size[0], box["y"] + y * box["height"] / size[1]

    page.mouse.move(*screen(*points[0]))
    page.mouse.down()
    for point in points[1:]:
        page.mouse.move(*screen(*point), steps=8)
    page.mouse.up()


def _near_segment(size, start, end, radius: float) -> np.ndarray:
    """Distance of every pixel centre to the segment start-end, less `radius`."""
    xs, ys = np.meshgrid(np.arange(size[0]) + 0.5, np.arange(size[1]) + 0.5)
    (ax, ay), (bx, by) = start, end
    dx, dy = bx - ax, by - ay
    t = np.clip(((xs - ax) * dx + (ys - ay) * dy) / (dx * dx + dy * dy), 0, 1)
    return np.hypot(xs - (ax + t * dx), ys - (ay + t * dy)) - radius


def test_inpainting_sends_the_mask_painted_with_the_mouse(visit, worker, tenant_key, tmp_path):
    page = visit.page
    uploads = _recorded_uploads(page)
    visit.sign_in(tenant_key)
    picture = _picture(1)
    chosen = tmp_path / "window.png"
    chosen.write_bytes(_png(picture))

    page.check("#f-kind-inpaint")
    expect(page.locator("#f-mask")).to_be_hidden()  # no image yet, nothing to paint on
    page.set_input_files("#f-image", str(chosen))
    expect(page.locator("#hint-image")).to_have_text(f"window.png: {SHOWN_SIZE} px.")
    canvas = page.locator("#f-mask")
    expect(canvas).to_be_visible()
    assert canvas.evaluate("c => [c.width, c.height]") == list(SIZE)
    assert page.input_value("#f-width") == "" and page.input_value("#f-height") == ""
    hint = f"the input's size within these: {SHOWN_SIZE}."
    expect(page.locator("#hint-size")).to_contain_text(hint)
    page.fill("#f-prompt", "a round window")
    page.fill("#f-steps", "3")
    page.fill("#f-seed", "5")

    # Nothing painted yet: said beside the mask, and no job is sent.
    page.click("#submit-job")
    expect(page.locator("#err-mask")).to_contain_text("Paint the part of the image to redraw")
    assert page.evaluate("document.activeElement.id") == "f-mask"
    assert _jobs(visit.base_url, tenant_key) == []

    # A stroke 16 px wide across the middle, then the eraser down its centre.
    page.fill("#f-brush", "16")
    expect(page.locator("#brush-size")).to_have_text("16 px")
    _drag(page, canvas, [(24, 48), (104, 48)])
    expect(page.locator("#err-mask")).to_be_empty()
    page.click("#tool-eraser")
    assert page.get_attribute("#tool-eraser", "aria-pressed") == "true"
    _drag(page, canvas, [(64, 4), (64, 92)])
    page.click("#submit-job")

    result = page.locator("#job-images figure:not(.input) img")
    expect(result).to_have_count(1)
    expect(page.locator("#job-state")).to_have_text(re.compile(r"^Succeeded"))
    assert result.evaluate("img => img.complete && [img.naturalWidth, img.naturalHeight]") == [
        *SIZE
    ]
    # The result beside the input, its mask over it.
    shown = page.locator("#job-images figure.input img:not(.mask)")
    expect(shown).to_be_visible()
    expect(page.locator("#job-images figure.input img.mask")).to_be_visible()
    before, after = shown.bounding_box(), result.bounding_box()
    assert after["x"] >= before["x"] + before["width"], (before, after)
    assert abs(after["y"] - before["y"]) < 1, (before, after)

    # What the API ran: an inpainting of the chosen image with the painted mask.
    [job] = _jobs(visit.base_url, tenant_key)
    assert job["status"] == "succeeded", job
    assert job["input"]["kind"] == "inpaint"
    assert job["input"]["strength"] == 1.0 and job["input"]["steps"] == 3
    assert (job["input"]["width"], job["input"]["height"]) == SIZE
    answers = {answer["sha256"]: answer for answer in (u.json() for u in uploads)}
    image_upload, mask_upload = answers[job["input"]["image"]], answers[job["input"]["mask"]]
    stored = requests.get(image_upload["urls"]["content"], headers=auth(tenant_key), timeout=10)
    assert Image.open(io.BytesIO(stored.content)).convert("RGB").tobytes() == picture.tobytes()
    content = requests.get(mask_upload["urls"]["content"], headers=auth(tenant_key), timeout=10)
    assert hashlib.sha256(content.content).hexdigest() == job["input"]["mask"]
    mask = np.asarray(Image.open(io.BytesIO(content.content)).convert("L"))
    assert mask.shape == (SIZE[1], SIZE[0])
    assert set(np.unique(mask)) == {0, 255}  # white and black, no grey
    stroke = _near_segment(SIZE, (24, 48), (104, 48), 8)
    erased = _near_segment(SIZE, (64, 4), (64, 92), 8)
    white = (stroke < 0) & (erased > 0)
    sure = (np.abs(stroke) > 1.5) & (np.abs(erased) > 1.5)  # away from the brush's edges
    wrong = np.argwhere(((mask == 255) != white) & sure)
    print(f"mask: {int((mask == 255).sum())} white pixels, {len(wrong)} off the drawing")
    assert len(wrong) == 0, wrong[:10]
    assert mask[48, 40] == 255 and mask[48, 88] == 255  # the stroke either side
    assert mask[48, 64] == 0 and mask[10, 40] == 0 and mask[48, 8] == 0  # erased, untouched
    visit.assert_clean()


def test_image_to_image_runs_at_the_strength_the_slider_sets(visit, worker, tenant_key):
    page = visit.page
    visit.sign_in(tenant_key)
    page.check("#f-kind-img2img")
    expect(page.locator("#f-strength")).to_have_value("0.75")
    expect(page.locator("#mask-part")).to_be_hidden()
    # Dropped on the field, as a file dragged from the desktop is.
    dropped = page.evaluate_handle(
        """([name, data]) => {
            const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
            const transfer = new DataTransfer();
            transfer.items.add(new File([bytes], name, { type: "image/png" }));
            return transfer;
        }""",
        ["dropped.png", base64.b64encode(_png(_picture(2))).decode()],
    )
    page.dispatch_event("#drop", "dragenter", {"dataTransfer": dropped})
    expect(page.locator("#drop")).to_have_class(re.compile(r"\bover\b"))
    page.dispatch_event("#drop", "drop", {"dataTransfer": dropped})
    expect(page.locator("#hint-image")).to_have_text(f"dropped.png: {SHOWN_SIZE} px.")
    expect(page.locator("#input-preview")).to_be_visible()
    expect(page.locator("#f-mask")).to_be_hidden()  # no mask to paint in this mode
    page.fill("#f-prompt", "a fox in snow")
    page.fill("#f-steps", "8")
    page.focus("#f-strength")
    # The estimate is asked for the steps the strength leaves, at the input's size.
    with page.expect_request(lambda r: "/estimate?" in r.url and "steps=4" in r.url) as asked:
        for _ in range(5):  # 0.75 down by 0.05 five times, from the keyboard
            page.keyboard.press("ArrowLeft")
    expect(page.locator("#strength-value")).to_have_text("0.50")
    query = parse_qs(urlparse(asked.value.url).query)
    assert query == {
        "width": ["128"],
        "height": ["96"],
        "steps": ["4"],
        "num_images": ["1"],
        "quality": ["exact"],  # the tier and the guidance count too (docs/quality.md)
        "guidance_scale": ["7.5"],
    }
    expect(page.locator("#estimate")).to_have_text(re.compile(r"^Expected time"))
    page.click("#submit-job")
    result = page.locator("#job-images figure:not(.input) img")
    expect(result).to_have_count(1)
    expect(page.locator("#job-state")).to_have_text(re.compile(r"^Succeeded"))
    assert "strength 0.5" in page.text_content("#job-images figure:not(.input) figcaption")
    [job] = _jobs(visit.base_url, tenant_key)
    assert job["input"]["kind"] == "img2img"
    assert job["input"]["strength"] == 0.5
    assert job["progress"]["total_steps"] == 4  # 8 steps x 0.5
    assert (job["input"]["width"], job["input"]["height"]) == SIZE  # the input's own

    # "Same again" sends the same image (by its upload's id) at the same strength.
    page.click("#same-again")
    expect(page.locator("#job-list li")).to_have_count(2)
    again, first = _jobs(visit.base_url, tenant_key)
    assert first["id"] == job["id"]
    for name in ("kind", "image", "strength", "seed", "steps", "width", "height"):
        assert again["input"][name] == first["input"][name], name
    visit.assert_clean()


def test_image_errors_appear_beside_their_fields(visit, tenant_key, tmp_path):
    page = visit.page
    visit.sign_in(tenant_key)
    page.check("#f-kind-img2img")
    page.click("#submit-job")  # no image chosen: the API's 422 names `image`
    expect(page.locator("#err-image")).to_have_text("Required for kind 'img2img'.")
    assert page.get_attribute("#f-image", "aria-invalid") == "true"
    assert page.evaluate("document.activeElement.id") == "f-image"

    notes = tmp_path / "notes.txt"
    notes.write_text("not a picture")
    page.set_input_files("#f-image", str(notes))  # refused by the upload itself (422)
    expect(page.locator("#err-image")).to_contain_text("Not an image")
    expect(page.locator("#editor")).to_be_hidden()

    chosen = tmp_path / "in.png"
    chosen.write_bytes(_png(_picture(3)))
    page.set_input_files("#f-image", str(chosen))
    expect(page.locator("#hint-image")).to_have_text(f"in.png: {SHOWN_SIZE} px.")
    expect(page.locator("#err-image")).to_be_empty()
    assert page.get_attribute("#f-image", "aria-invalid") is None
    page.fill("#f-steps", "4")
    page.fill("#f-strength", "0.05")  # 4 steps x 0.05 leaves none to run
    expect(page.locator("#strength-value")).to_have_text("0.05")
    page.click("#submit-job")
    expect(page.locator("#err-strength")).to_contain_text("leaves no step")
    assert page.get_attribute("#f-strength", "aria-invalid") == "true"
    assert page.text_content("#err-image") == ""
    assert _jobs(visit.base_url, tenant_key) == []  # the API refused both; nothing queued

    # A model that offers text to image only: the image modes go, the form goes back.
    page.select_option("#f-model", "tiny-b")
    expect(page.locator("#f-kind-img2img")).to_be_hidden()
    expect(page.locator("#f-kind-inpaint")).to_be_hidden()
    assert page.is_checked("#f-kind-txt2img")
    expect(page.locator("#image-part")).to_be_hidden()
    expect(page.locator("#hint-kind")).to_have_text("tiny-b offers text to image only.")
    assert page.input_value("#f-width") == "64"  # its default size is back
    page.select_option("#f-model", "tiny")
    expect(page.locator("#f-kind-img2img")).to_be_visible()
    expect(page.locator("#hint-kind")).to_be_empty()
    visit.assert_clean()


def test_an_inpainting_model_offers_that_only_and_a_413_is_said(
    visit_at, page_api, tenant_key, tmp_path
):
    visit = visit_at(page_api.url)
    page = visit.page
    visit.sign_in(tenant_key)
    expect(page.locator("#f-kind-inpaint")).to_be_visible()  # tiny-b offers every kind here
    page.select_option("#f-model", "page-inpaint")
    assert page.is_checked("#f-kind-inpaint")
    for other in ("txt2img", "img2img"):
        expect(page.locator(f"#f-kind-{other}")).to_be_hidden()
    expect(page.locator("#hint-kind")).to_have_text("page-inpaint offers inpainting only.")
    expect(page.locator("#image-part")).to_be_visible()
    expect(page.locator("#f-strength")).to_have_value("1")
    assert page.get_attribute("#f-width", "placeholder") == "the input's"

    large = tmp_path / "large.png"  # past page_api's DIFFQ_INPUT_MAX_BYTES (conftest.py)
    large.write_bytes(_png(_picture(4, size=(256, 256))))
    page.set_input_files("#f-image", str(large))
    error = page.locator("#err-image")
    expect(error).to_contain_text("bytes (DIFFQ_INPUT_MAX_BYTES)")
    limit = int(re.search(r"the limit is (\d+) bytes", error.text_content()).group(1))
    assert large.stat().st_size > limit
    assert page.get_attribute("#f-image", "aria-invalid") == "true"
    visit.assert_clean()
