"""A job travels the whole real path: HTTP -> PostgreSQL -> RabbitMQ -> worker -> S3 -> HTTP."""

from __future__ import annotations

import io

import pytest
import requests
from PIL import Image

from testbed.jobs import auth, submit, wait_terminal

pytestmark = pytest.mark.services


def download(url: str) -> requests.Response:
    response = requests.get(url, timeout=10)
    assert response.status_code == 200, response.text[:200]
    return response


@pytest.mark.parametrize(
    ("output_format", "content_type", "pil_format"),
    [("png", "image/png", "PNG"), ("jpeg", "image/jpeg", "JPEG"), ("webp", "image/webp", "WEBP")],
)
def test_job_succeeds_and_its_image_downloads_from_s3(
    api_server, worker, tenant_key, output_format, content_type, pil_format
):
    job = submit(
        api_server.url,
        tenant_key,
        prompt="a lighthouse at dusk",
        width=128,
        height=64,
        steps=3,
        seed=42,
        output_format=output_format,
    )
    assert job["status"] == "queued"
    done = wait_terminal(api_server.url, tenant_key, job["id"])
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 1
    [image] = done["result"]["images"]
    assert (image["width"], image["height"], image["seed"]) == (128, 64, 42)
    assert image["content_type"] == content_type
    body = download(image["url"])
    assert body.headers["Content-Type"] == content_type
    assert len(body.content) == image["bytes"]
    decoded = Image.open(io.BytesIO(body.content))
    assert decoded.format == pil_format
    assert decoded.size == (128, 64)
    assert done["progress"] == {"stage": "done", "step": 3, "total_steps": 3, "percent": 100.0}
    assert done["metrics"]["run_seconds"] > 0


def test_presigned_url_is_signed_and_served_by_s3(api_server, worker, tenant_key, stack):
    job = submit(api_server.url, tenant_key, prompt="a kite", steps=2, seed=1)
    done = wait_terminal(api_server.url, tenant_key, job["id"])
    url = done["result"]["images"][0]["url"]
    assert url.startswith(stack.s3.endpoint)
    assert "X-Amz-Signature=" in url and "X-Amz-Expires=900" in url
    unsigned = url.split("?")[0]
    assert requests.get(unsigned, timeout=10).status_code == 403
    tampered = url.replace("X-Amz-Signature=", "X-Amz-Signature=0")
    assert requests.get(tampered, timeout=10).status_code == 403


def test_same_seed_gives_identical_bytes(api_server, worker, tenant_key):
    def image_bytes(seed: int) -> bytes:
        job = submit(api_server.url, tenant_key, prompt="a red fox", steps=3, seed=seed)
        done = wait_terminal(api_server.url, tenant_key, job["id"])
        return download(done["result"]["images"][0]["url"]).content

    first, second, other = image_bytes(1234), image_bytes(1234), image_bytes(4321)
    assert first == second
    assert first != other


def test_several_images_get_consecutive_seeds(api_server, worker, tenant_key):
    job = submit(api_server.url, tenant_key, prompt="two cats", num_images=2, seed=10, steps=2)
    done = wait_terminal(api_server.url, tenant_key, job["id"])
    images = done["result"]["images"]
    assert [i["seed"] for i in images] == [10, 11]
    contents = [download(i["url"]).content for i in images]
    assert contents[0] != contents[1]


def test_image_route_redirects_to_presigned_url(api_server, worker, tenant_key):
    job = submit(api_server.url, tenant_key, prompt="a boat", steps=2)
    wait_terminal(api_server.url, tenant_key, job["id"])
    response = requests.get(
        f"{api_server.url}/v1/jobs/{job['id']}/images/0",
        headers=auth(tenant_key),
        allow_redirects=False,
        timeout=10,
    )
    assert response.status_code == 302
    assert "X-Amz-Signature=" in response.headers["Location"]
    assert Image.open(io.BytesIO(download(response.headers["Location"]).content)).size == (64, 64)
    missing = requests.get(
        f"{api_server.url}/v1/jobs/{job['id']}/images/1", headers=auth(tenant_key), timeout=10
    )
    assert missing.status_code == 404


def test_seed_is_chosen_and_recorded_when_absent(api_server, worker, tenant_key):
    job = submit(api_server.url, tenant_key, prompt="a random seed", steps=2)
    seed = job["input"]["seed"]
    assert 0 <= seed < 2**32
    done = wait_terminal(api_server.url, tenant_key, job["id"])
    assert done["result"]["images"][0]["seed"] == seed
