"""POST /v1/images/generations driven by the real `openai` Python client (`base_url`)."""

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


def test_urls_for_a_generated_batch_and_the_job_is_listed(api_server, worker, tenant_key):
    client = _client(api_server.url, tenant_key)
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
    jobs = requests.get(f"{api_server.url}/v1/jobs", headers=auth(tenant_key), timeout=10).json()
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
