"""The OpenAI Images API (generations and edits) driven by the real `openai` Python client;
a generation and the edits on both modes (`served`: production's stores, then `diffq up`'s
embedded ones)."""

from __future__ import annotations

import base64
import hashlib

import openai
import pytest
import requests

from testbed.jobs import auth
from testbed.processes import ApiServer

pytestmark = pytest.mark.services

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RATE = 4


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=90)


@pytest.fixture(scope="module")
def strict_api(stack):
    """An API with a low request rate and a 2 s cap on waits."""
    env = {**stack.env, "DIFFQ_RATE_LIMIT": str(RATE), "DIFFQ_MAX_WAIT": "2"}
    server = ApiServer(env, stack.logs, name="api-openai").start()
    yield server
    server.stop()


def test_urls_for_a_generated_batch_and_the_job_is_listed(served):
    client = _client(served.api.url, served.key)
    answer = client.images.generate(
        model="tiny",
        prompt="an openai client's lighthouse",
        n=2,
        size="64x64",
        response_format="url",
        user="end-user-7",
        extra_body={"steps": 2},
    )
    assert len(answer.data) == 2 and answer.created > 0
    for image in answer.data:
        download = requests.get(image.url, timeout=10)
        assert download.status_code == 200 and download.content.startswith(PNG_MAGIC)
    jobs = requests.get(f"{served.api.url}/v1/jobs", headers=auth(served.key), timeout=10).json()
    assert len(jobs["data"]) == 1
    job = jobs["data"][0]
    assert job["status"] == "succeeded" and job["input"]["num_images"] == 2
    assert job["metadata"] == {"user": "end-user-7"}


def test_b64_json_inlines_the_stored_png(api_server, worker, tenant_key):
    client = _client(api_server.url, tenant_key)
    raw = client.images.with_raw_response.generate(
        model="dall-e-2", prompt="inline me", response_format="b64_json", extra_body={"steps": 2}
    )
    answer = raw.parse()
    png = base64.b64decode(answer.data[0].b64_json)
    assert png.startswith(PNG_MAGIC)
    job_id = raw.headers["diffq-job-id"]
    job = requests.get(f"{api_server.url}/v1/jobs/{job_id}", headers=auth(tenant_key), timeout=10)
    assert job.json()["model"] == "tiny"  # dall-e-2 means the default model
    assert job.json()["result"]["images"][0]["sha256"] == hashlib.sha256(png).hexdigest()


def test_a_bad_key_is_the_clients_authentication_error(api_server):
    with pytest.raises(openai.AuthenticationError) as caught:
        _client(api_server.url, "dq_nope_nope").images.generate(prompt="x")
    assert caught.value.status_code == 401
    assert caught.value.type == "authentication_error"


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"size": "100x64"}, "size"),
        ({"size": "big"}, "size"),
        ({"size": "256x256"}, "size"),  # over the model's max_pixels
        ({"n": 4}, "n"),  # over the model's max_num_images (3)
        ({"model": "no-such-model"}, "model"),
        ({"response_format": "gif"}, "response_format"),
        ({"user": "u" * 300}, "user"),
    ],
)
def test_an_invalid_request_names_its_parameter(api_server, tenant_key, params, param):
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        _client(api_server.url, tenant_key).images.generate(prompt="bad", **params)
    assert caught.value.status_code == 422
    assert caught.value.param == param, caught.value.message
    assert caught.value.type == "invalid_request_error"


def test_over_the_rate_limit_is_the_clients_rate_limit_error(strict_api, tenant_key):
    client = _client(strict_api.url, tenant_key)
    outcomes = []
    for _ in range(2 * RATE + 1):
        try:
            client.images.generate(prompt="rate", n=99)  # refused at once: 422
        except openai.UnprocessableEntityError:
            outcomes.append(422)
        except openai.RateLimitError as exc:
            outcomes.append(429)
            assert exc.response.headers["Retry-After"]
            assert exc.type == "rate_limit_error"
            break
    print(f"\nrate limit {RATE}/min: answers {outcomes}")
    assert outcomes[-1] == 429 and outcomes.count(422) <= RATE


def test_past_the_wait_is_a_clear_error_and_the_job_keeps_going(strict_api, tenant_key):
    # No worker serves tiny-b: the job stays queued past the 2 s cap.
    with pytest.raises(openai.InternalServerError) as caught:
        _client(strict_api.url, tenant_key).images.generate(model="tiny-b", prompt="slow")
    error = caught.value
    assert error.status_code == 504 and error.code == "timeout"
    assert error.response.headers["x-should-retry"] == "false"
    job_id = error.response.headers["diffq-job-id"]
    assert job_id in error.message
    job = requests.get(f"{strict_api.url}/v1/jobs/{job_id}", headers=auth(tenant_key), timeout=10)
    assert job.json()["status"] == "queued"
    requests.post(f"{strict_api.url}/v1/jobs/{job_id}/cancel", headers=auth(tenant_key), timeout=10)


def _png_bytes(image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _holed(size=(96, 64), hole=(30, 16, 60, 40)):
    """A picture, and the same picture with a fully transparent hole (OpenAI's mask)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(9)
    picture = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    holed = picture.convert("RGBA")
    holed.paste((0, 0, 0, 0), hole)
    return picture, holed


def _far_from(hole, size, margin: int):
    """Pixels farther than `margin` from the hole: the mask's blur cannot reach them."""
    import numpy as np

    untouched = np.ones((size[1], size[0]), dtype=bool)
    left, top, right, bottom = hole
    untouched[max(0, top - margin) : bottom + margin, max(0, left - margin) : right + margin] = (
        False
    )
    return untouched


@pytest.mark.parametrize("with_mask", [True, False])
def test_images_edit_redraws_the_transparent_part_only(served, with_mask):
    """OpenAI's convention: a fully transparent pixel (of the mask, or without one of the
    image itself) is what to edit. The rest of the picture comes back as it was."""
    import io

    import numpy as np
    from PIL import Image

    picture, holed = _holed()
    client = _client(served.api.url, served.key)
    if with_mask:
        raw = client.images.with_raw_response.edit(
            image=("picture.png", _png_bytes(picture), "image/png"),
            mask=("mask.png", _png_bytes(holed), "image/png"),
            prompt="a window",
            response_format="b64_json",
            extra_body={"steps": 3, "seed": 5},
        )
    else:
        raw = client.images.with_raw_response.edit(
            image=("holed.png", _png_bytes(holed), "image/png"),
            prompt="a window",
            response_format="b64_json",
            extra_body={"steps": 3, "seed": 5},
        )
    answer = raw.parse()
    made = np.asarray(
        Image.open(io.BytesIO(base64.b64decode(answer.data[0].b64_json))).convert("RGB")
    )
    base = np.asarray(picture)
    untouched = _far_from((30, 16, 60, 40), picture.size, margin=12)
    assert made.shape == base.shape
    assert (made[untouched] == base[untouched]).all()
    assert np.mean(made[30:40, 35:55] != base[30:40, 35:55]) > 0.5
    job_id = raw.headers["diffq-job-id"]
    job = requests.get(f"{served.api.url}/v1/jobs/{job_id}", headers=auth(served.key), timeout=10)
    assert job.json()["input"]["kind"] == "inpaint"


def test_images_edit_without_transparency_redraws_the_whole_image(api_server, worker, tenant_key):
    picture, _ = _holed()
    client = _client(api_server.url, tenant_key)
    raw = client.images.with_raw_response.edit(
        image=("picture.png", _png_bytes(picture), "image/png"),
        prompt="in autumn",
        n=2,
        extra_body={"steps": 4, "strength": 0.5},
    )
    answer = raw.parse()
    assert len(answer.data) == 2
    job = requests.get(
        f"{api_server.url}/v1/jobs/{raw.headers['diffq-job-id']}",
        headers=auth(tenant_key),
        timeout=10,
    ).json()
    assert job["input"]["kind"] == "img2img" and job["input"]["strength"] == 0.5
    assert job["progress"]["total_steps"] == 2


def test_images_edit_refuses_what_it_cannot_run_naming_the_param(api_server, tenant_key):
    from PIL import Image

    picture, _ = _holed()
    client = _client(api_server.url, tenant_key)
    small_mask = Image.new("RGBA", (32, 32), (0, 0, 0, 0))
    cases = {
        "mask": dict(
            image=("picture.png", _png_bytes(picture), "image/png"),
            mask=("mask.png", _png_bytes(small_mask), "image/png"),
        ),
        "image": dict(image=("picture.png", b"not an image", "image/png")),
    }
    for param, files in cases.items():
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            client.images.edit(prompt="x", **files)
        assert refused.value.body["param"] == param, refused.value.body
