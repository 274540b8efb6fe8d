"""Every request limit is a 422 that names the field and the limit; nothing is stored or sent."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from testbed.jobs import auth
from testbed.services import queue_state

pytestmark = pytest.mark.services

VALID = {"prompt": "a quiet harbour", "model": "tiny-b"}

# (field named in the error, body overrides, a fragment the message must contain)
CASES = [
    ("prompt", {"prompt": None}, "null"),
    ("prompt", {"prompt": ""}, "empty"),
    ("prompt", {"prompt": "   "}, "blank"),
    ("prompt", {"prompt": "x" * 2001}, "2000"),
    ("prompt", {"prompt": 42}, "string"),
    ("negative_prompt", {"negative_prompt": "y" * 2001}, "2000"),
    ("model", {"model": "no-such-model"}, "tiny, tiny-b"),
    ("width", {"width": 100}, "multiple of 8"),
    ("width", {"width": 32}, "between 64 and 128"),
    ("width", {"width": 136}, "between 64 and 128"),
    ("width", {"width": "64"}, "integer"),
    ("width", {"width": 64.5}, "integer"),
    ("height", {"height": 200}, "between 64 and 128"),
    ("height", {"height": 68}, "multiple of 8"),
    ("width", {"width": 128, "height": 128}, "8192"),
    ("steps", {"steps": 0}, "between 1 and 10"),
    ("steps", {"steps": 11}, "between 1 and 10"),
    ("steps", {"steps": "4"}, "integer"),
    ("guidance_scale", {"guidance_scale": -0.5}, "between 0 and 12.0"),
    ("guidance_scale", {"guidance_scale": 12.5}, "between 0 and 12.0"),
    ("guidance_scale", {"guidance_scale": "high"}, "number"),
    ("seed", {"seed": -1}, "4294967295"),
    ("seed", {"seed": 2**32}, "4294967295"),
    ("num_images", {"num_images": 0}, "between 1 and 2"),
    ("num_images", {"num_images": 3}, "between 1 and 2"),
    ("scheduler", {"scheduler": "dpm++"}, "default, euler"),
    ("scheduler", {"scheduler": "bogus"}, "default, euler"),
    ("output_format", {"output_format": "gif"}, "png, jpeg, webp"),
    ("priority", {"priority": "urgent"}, "low, normal, high"),
    ("metadata", {"metadata": {"blob": "z" * 3000}}, "2048"),
    ("metadata", {"metadata": [1, 2]}, "mapping"),
    ("unexpected", {"unexpected": 1}, "Unknown field"),
    # Every form the resolver reads as a private or loopback address, refused at submit.
    ("webhook", {"webhook": "http://127.1/hook"}, "not a public address"),
    ("webhook", {"webhook": "http://2130706433/hook"}, "not a public address"),
    ("webhook", {"webhook": "http://0177.0.0.1/hook"}, "not a public address"),
    ("webhook", {"webhook": "http://0x7f000001/hook"}, "not a public address"),
    ("webhook", {"webhook": "http://localhost:8000/hook"}, "not a public address"),
    ("webhook", {"webhook": "http://[::ffff:7f00:1]/hook"}, "IPv4-mapped"),
    ("webhook", {"webhook": "http://[fe80::1%25eth0]/hook"}, "not a public address"),
    ("webhook", {"webhook": "http://[::1]/hook"}, "::1 is not a public address (loopback)"),
    # PostgreSQL cannot store U+0000: bad input naming the field, never a store error.
    ("prompt", {"prompt": "a\x00b"}, "NUL"),
    ("negative_prompt", {"negative_prompt": "\x00"}, "NUL"),
    ("model", {"model": "tiny\x00"}, "NUL"),
    ("scheduler", {"scheduler": "euler\x00"}, "NUL"),
    ("metadata", {"metadata": {"k": "v\x00"}}, "NUL"),
    ("metadata", {"metadata": {"k\x00": 1}}, "NUL"),
    ("metadata", {"metadata": {"deep": [{"x": ["\x00"]}]}}, "NUL"),
    ("webhook", {"webhook": "https://example.com/\x00"}, "NUL"),
    ("webhook_events", {"webhook_events": ["job.succeeded\x00"]}, "NUL"),
]


def _job_count(db) -> int:
    from app.db.models.jobs import Job

    with db.session() as session:
        return session.scalar(select(func.count()).select_from(Job))


@pytest.mark.parametrize(
    ("field", "overrides", "fragment"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_each_limit_is_a_422_naming_the_field(
    client, tenant_key, db, stack, field, overrides, fragment
):
    messages_before, consumers = queue_state(stack.broker_url, "gpu.tiny-b")
    assert consumers == 0, "a consumer would hide a stray message"
    jobs_before = _job_count(db)

    response = client.post("/v1/jobs", json={**VALID, **overrides}, headers=auth(tenant_key))

    assert response.status_code == 422, response.json
    body = response.json
    assert body["code"] == 422 and body["status"] == "Unprocessable Entity"
    errors = body["errors"]["json"]
    assert field in errors, errors
    assert any(fragment in message for message in errors[field]), errors[field]
    assert _job_count(db) == jobs_before
    assert queue_state(stack.broker_url, "gpu.tiny-b")[0] == messages_before


def test_a_nul_in_the_idempotency_key_is_a_422_naming_the_header(client, tenant_key, db):
    jobs_before = _job_count(db)
    headers = {**auth(tenant_key), "Idempotency-Key": "a\x00b", "X-Other": "c\x00d"}
    response = client.post("/v1/jobs", json=VALID, headers=headers)
    assert response.status_code == 422, response.json
    # Only the header the schema reads is looked at; another one is dropped unread.
    assert set(response.json["errors"]["headers"]) == {"Idempotency-Key"}
    assert _job_count(db) == jobs_before


def test_all_broken_fields_are_reported_together(client, tenant_key):
    response = client.post(
        "/v1/jobs",
        json={**VALID, "width": 30, "steps": 99, "seed": -5, "output_format": "bmp"},
        headers=auth(tenant_key),
    )
    assert response.status_code == 422
    assert {"width", "steps", "seed", "output_format"} <= set(response.json["errors"]["json"])


def test_a_valid_request_at_every_limit_is_accepted(client, tenant_key, stack):
    body = {
        **VALID,
        "prompt": "p" * 2000,
        "width": 128,
        "height": 64,
        "steps": 10,
        "guidance_scale": 12.0,
        "seed": 2**32 - 1,
        "num_images": 2,
        "scheduler": "euler",
        "output_format": "webp",
        "priority": "high",
        "metadata": {"order": 7},
    }
    messages_before, _ = queue_state(stack.broker_url, "gpu.tiny-b")
    response = client.post("/v1/jobs", json=body, headers=auth(tenant_key))
    assert response.status_code == 202, response.json
    job = response.json
    assert job["input"]["seed"] == 2**32 - 1 and job["input"]["scheduler"] == "euler"
    assert job["metadata"] == {"order": 7}
    assert response.headers["Location"].endswith(f"/v1/jobs/{job['id']}")
    assert queue_state(stack.broker_url, "gpu.tiny-b")[0] == messages_before + 1


def test_defaults_come_from_the_model(client, tenant_key):
    response = client.post("/v1/jobs", json={"prompt": "defaults"}, headers=auth(tenant_key))
    assert response.status_code == 202
    params = response.json["input"]
    assert params["model"] == "tiny"
    assert (params["width"], params["height"], params["steps"]) == (64, 64, 4)
    assert params["num_images"] == 1 and params["output_format"] == "png"


def test_malformed_json_is_a_400(client, tenant_key):
    response = client.post(
        "/v1/jobs",
        data="{not json",
        headers={**auth(tenant_key), "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json["code"] == 400


def test_oversized_body_is_a_413(client, tenant_key, db):
    from app.config import load_settings

    jobs_before = _job_count(db)
    pad = "y" * (load_settings().max_body_bytes + 1)
    body = json.dumps({"prompt": "x", "metadata": {"pad": pad}})
    response = client.post(
        "/v1/jobs", data=body, headers={**auth(tenant_key), "Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json["code"] == 413
    assert _job_count(db) == jobs_before
