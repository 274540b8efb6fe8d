"""Quality tiers through the whole path, on PostgreSQL, RabbitMQ and S3 and on `diffq up`'s
embedded stores: `GET /v1/models` shows the tiny model's tiers, a `fast` job runs on the
worker with guidance cut after half its steps (its manifest says so) and makes another
image than `exact` from the same seed, the tier is in the row and the cache key (the same
request at another tier is not a cache hit; at the same tier it is), an unknown tier is a
422 naming `quality`, and OpenAI's `quality: low` runs as `fast`."""

from __future__ import annotations

import pytest
import requests

from testbed.jobs import auth, submit, wait_terminal

pytestmark = pytest.mark.services

BODY = {"prompt": "a harbour at dusk", "width": 64, "height": 64, "steps": 4, "seed": 11}


def _picture(job: dict) -> bytes:
    return requests.get(job["result"]["images"][0]["url"], timeout=10).content


def test_a_tier_runs_through_the_whole_path(served):
    url, key = served.api.url, served.key
    models = requests.get(f"{url}/v1/models", headers=auth(key), timeout=10).json()["data"]
    tiny = next(m for m in models if m["name"] == "tiny")
    assert tiny["quality"]["default"] == "exact"
    assert tiny["quality"]["tiers"]["fast"] == {"guidance_until": 0.5}
    assert tiny["quality"]["psnr"] == {}  # none measured in its catalog entry

    # A job run first: the worker records the model's digest before it takes any, and the
    # API keys the result cache on it from then on (a job accepted before a fresh
    # worker recorded it is not cached: `diffq up`'s first minute).
    first = submit(url, key, **{**BODY, "seed": 12})
    assert wait_terminal(url, key, first["id"], timeout=120)["status"] == "succeeded"

    exact = submit(url, key, **BODY)
    fast = submit(url, key, **BODY, quality="fast")
    exact, fast = (wait_terminal(url, key, j["id"], timeout=120) for j in (exact, fast))
    assert exact["status"] == fast["status"] == "succeeded", (exact, fast)
    assert "quality" not in exact["input"] and fast["input"]["quality"] == "fast"
    assert exact["result"]["manifest"]["quality"] == {"tier": "exact"}
    assert fast["result"]["manifest"]["quality"] == {
        "tier": "fast",
        "guidance_until": 0.5,
        "guided_steps": 2,
    }
    assert not fast["cached"], "the same request at another tier is not a cache hit"
    assert _picture(exact) != _picture(fast)

    again = wait_terminal(url, key, submit(url, key, **BODY, quality="fast")["id"], timeout=120)
    assert again["cached"] and again["cached_from"] == fast["id"]

    refused = requests.post(
        f"{url}/v1/jobs", json={**BODY, "quality": "ultra"}, headers=auth(key), timeout=10
    )
    assert refused.status_code == 422, refused.text
    assert "quality" in refused.json()["errors"]["json"], refused.text
    guided = fast["result"]["manifest"]["quality"]["guided_steps"]
    print(f"{served.mode}: exact and fast ran; fast guided {guided} of {BODY['steps']} steps")


def test_openai_quality_low_runs_as_the_fast_tier(served):
    url, key = served.api.url, served.key
    answer = requests.post(
        f"{url}/v1/images/generations",
        json={"prompt": "a quiet street", "size": "64x64", "quality": "low", "steps": 2},
        headers=auth(key),
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    job = requests.get(
        f"{url}/v1/jobs/{answer.headers['diffq-job-id']}", headers=auth(key), timeout=10
    ).json()
    assert job["input"]["quality"] == "fast"
    assert job["result"]["manifest"]["quality"]["tier"] == "fast"
