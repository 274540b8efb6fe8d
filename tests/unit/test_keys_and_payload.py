"""API key format and the versioned task payload."""

from __future__ import annotations

import base64
import uuid

import pytest

from app.jobs.payload import InvalidPayload, parse_payload
from app.keys import _KEY_RE, generate_key


def test_keys_have_a_prefix_and_256_random_bits():
    keys = {generate_key().plaintext for _ in range(200)}
    assert len(keys) == 200
    for key in keys:
        match = _KEY_RE.match(key)
        assert match and key.startswith("dq_")
        secret = match.group(2)
        assert len(base64.urlsafe_b64decode(secret + "=")) == 32


def test_a_well_formed_payload_parses():
    job_id, tenant = uuid.uuid4(), uuid.uuid4()
    payload = parse_payload(
        {"v": 1, "job_id": str(job_id), "tenant": str(tenant), "params": {"prompt": "p"}}
    )
    assert (payload.job_id, payload.tenant, payload.params) == (job_id, tenant, {"prompt": "p"})


@pytest.mark.parametrize(
    ("raw", "fragment", "has_job_id"),
    [
        ("not a dict", "not an object", False),
        ({"v": 1, "job_id": "nope"}, "job_id is not a UUID", False),
        (
            {"v": 2, "job_id": str(uuid.uuid4()), "tenant": str(uuid.uuid4()), "params": {}},
            "version 2",
            True,
        ),
        (
            {"v": 1, "job_id": str(uuid.uuid4()), "tenant": str(uuid.uuid4()), "params": []},
            "params",
            True,
        ),
        ({"v": 1, "job_id": str(uuid.uuid4()), "tenant": 7, "params": {}}, "tenant", True),
    ],
)
def test_broken_payloads_are_refused_with_the_job_id_when_known(raw, fragment, has_job_id):
    with pytest.raises(InvalidPayload, match=fragment) as caught:
        parse_payload(raw)
    assert (caught.value.job_id is not None) == has_job_id
