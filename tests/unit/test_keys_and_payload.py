"""API key format and the versioned task payload."""

from __future__ import annotations

import base64
import uuid

import pytest

from app.broker.payload import (
    PAYLOAD_VERSION,
    InvalidPayload,
    TaskPayload,
    build_payload,
    parse_payload,
)
from app.keys import _KEY_RE, generate_key


def test_keys_have_a_prefix_and_256_random_bits():
    keys = {generate_key().plaintext for _ in range(200)}
    assert len(keys) == 200
    for key in keys:
        match = _KEY_RE.match(key)
        assert match and key.startswith("dq_")
        secret = match.group(2)
        assert len(base64.urlsafe_b64decode(secret + "=")) == 32


def test_a_message_carries_ids_only():
    from app.db.models.jobs import Job

    job = Job(id=uuid.uuid4(), tenant_id=uuid.uuid4(), input={"prompt": "secret"}, requeues=2)
    built = build_payload(job)
    assert built == {
        "v": PAYLOAD_VERSION,
        "job_id": str(job.id),
        "tenant": str(job.tenant_id),
        "requeues": 2,  # the hand-backs so far: a redelivery from before one is stale
    }
    assert "secret" not in str(built)
    parsed = parse_payload(built)
    assert (parsed.job_id, parsed.tenant, parsed.requeues) == (job.id, job.tenant_id, 2)
    # A job just stored (the submit's snapshot: no count read back) was never handed back.
    assert build_payload(Job(id=job.id, tenant_id=job.tenant_id))["requeues"] == 0


def test_a_message_from_before_the_requeue_count_reads_as_current():
    job_id, tenant = uuid.uuid4(), uuid.uuid4()
    parsed = parse_payload({"v": 2, "job_id": str(job_id), "tenant": str(tenant)})
    assert parsed == TaskPayload(job_id, tenant) and parsed.requeues is None


def test_a_version_1_message_queued_before_an_upgrade_still_parses():
    """Version 1 carried the request too: its params are ignored, the row is read."""
    job_id, tenant = uuid.uuid4(), uuid.uuid4()
    for params in ({"prompt": "p"}, [], None):
        raw = {"v": 1, "job_id": str(job_id), "tenant": str(tenant), "params": params}
        assert parse_payload(raw) == TaskPayload(job_id, tenant)


@pytest.mark.parametrize(
    ("raw", "fragment", "has_job_id"),
    [
        ("not a dict", "not an object", False),
        ({"v": 2, "job_id": "nope"}, "job_id is not a UUID", False),
        ({"v": 3, "job_id": str(uuid.uuid4()), "tenant": str(uuid.uuid4())}, "version 3", True),
        ({"job_id": str(uuid.uuid4()), "tenant": str(uuid.uuid4())}, "version None", True),
        ({"v": 2, "job_id": str(uuid.uuid4()), "tenant": 7}, "tenant", True),
        ({"v": 1, "job_id": str(uuid.uuid4()), "tenant": None, "params": {}}, "tenant", True),
        *(
            (
                {"v": 2, "job_id": str(uuid.uuid4()), "tenant": str(uuid.uuid4()), "requeues": bad},
                "requeues",
                True,
            )
            for bad in (-1, "1", 1.5, True)
        ),
    ],
)
def test_broken_payloads_are_refused_with_the_job_id_when_known(raw, fragment, has_job_id):
    with pytest.raises(InvalidPayload, match=fragment) as caught:
        parse_payload(raw)
    assert (caught.value.job_id is not None) == has_job_id
