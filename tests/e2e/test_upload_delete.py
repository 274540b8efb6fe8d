"""`DELETE /v1/uploads/{id}` removes the stored image at once, in both modes (S3 behind
the API under gunicorn; `diffq up`'s local store): a link handed out before answers 404
from then on. An image that a job whose results are kept names stays until those results
go: the job's replay still runs on it."""

from __future__ import annotations

import io
from urllib.parse import urljoin

import numpy as np
import pytest
import requests
from PIL import Image

from testbed.jobs import auth, submit, wait_terminal

pytestmark = pytest.mark.services


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _upload(served, data: bytes) -> dict:
    made = requests.post(
        f"{served.api.url}/v1/uploads",
        files={"file": ("in.png", data)},
        headers=auth(served.key),
        timeout=30,
    )
    assert made.status_code == 201, made.text
    return made.json()


def _link(served, made: dict) -> str:
    """The signed link `GET …/content` redirects to, as a client would keep it."""
    content = requests.get(
        made["urls"]["content"], headers=auth(served.key), timeout=10, allow_redirects=False
    )
    assert content.status_code == 302, content.text
    return urljoin(served.api.url + "/", content.headers["Location"])


def _delete(served, made: dict) -> None:
    gone = requests.delete(made["urls"]["self"], headers=auth(served.key), timeout=10)
    assert gone.status_code == 204, gone.text


def test_a_deleted_uploads_link_answers_404_at_once(served):
    data = _png(11)
    made = _upload(served, data)
    link = _link(served, made)
    before = requests.get(link, timeout=10)
    assert before.status_code == 200 and Image.open(io.BytesIO(before.content)).size == (64, 48)
    _delete(served, made)
    after = requests.get(link, timeout=10)
    assert after.status_code == 404, f"{after.status_code}: the deleted image is still served"
    looked = requests.get(made["urls"]["self"], headers=auth(served.key), timeout=10)
    assert looked.status_code == 404
    again = _upload(served, data)  # the same image, uploaded anew: stored again
    assert requests.get(_link(served, again), timeout=10).status_code == 200


def test_an_upload_a_kept_job_names_stays_for_its_replay(served):
    made = _upload(served, _png(12))
    job = submit(
        served.api.url,
        served.key,
        kind="img2img",
        prompt="a fox",
        image=made["id"],
        steps=4,
        seed=5,
    )
    done = wait_terminal(served.api.url, served.key, job["id"], timeout=120)
    assert done["status"] == "succeeded", done
    link = _link(served, made)
    _delete(served, made)
    looked = requests.get(made["urls"]["self"], headers=auth(served.key), timeout=10)
    assert looked.status_code == 404  # the id names nothing
    assert requests.get(link, timeout=10).status_code == 200  # the job's results need it
    replay = requests.post(
        f"{served.api.url}/v1/jobs/{job['id']}/replay", headers=auth(served.key), timeout=10
    )
    assert replay.status_code == 202, replay.text
    replayed = wait_terminal(served.api.url, served.key, replay.json()["id"], timeout=120)
    assert replayed["status"] == "succeeded", replayed
    assert replayed["replay"]["bytes_match"] is True
