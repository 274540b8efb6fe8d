"""diffq.client's pieces without a server: webhook verification against the service's own
signing, the event-stream parser, errors from problem documents, its imports; and a
batch job's id from its line."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from app.webhooks import signing
from diffq.client import (
    NotFoundError,
    RateLimitError,
    UnprocessableEntityError,
    WebhookVerificationError,
    verify_webhook,
)
from diffq.client._core import SSEParser, headers_for, raise_for

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _signed(body: bytes, secrets=(SECRET,), timestamp=1_800_000_000) -> dict[str, str]:
    return signing.headers(list(secrets), "msg_1", timestamp, body)


def test_a_webhook_signed_by_the_service_verifies():
    body = json.dumps({"type": "batch.completed", "data": {"id": "b"}}).encode()
    event = verify_webhook(body, _signed(body), SECRET, now=1_800_000_010)
    assert event["type"] == "batch.completed"
    rotated = _signed(body, ("whsec_" + "A" * 32, SECRET))  # one signature per secret
    assert verify_webhook(body, rotated, SECRET, now=1_800_000_000)["data"] == {"id": "b"}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda b, h: (b + b" ", h), "no signature"),
        (lambda b, h: (b, {**h, "webhook-id": "msg_2"}), "no signature"),
        (lambda b, h: (b, {k: v for k, v in h.items() if k != "webhook-signature"}), "missing"),
        (lambda b, h: (b, {**h, "webhook-timestamp": "1799999000"}), "timestamp"),
    ],
)
def test_a_changed_or_stale_webhook_does_not_verify(change, why):
    body = b'{"type": "job.succeeded"}'
    altered_body, headers = change(body, _signed(body))
    with pytest.raises(WebhookVerificationError, match=why):
        verify_webhook(altered_body, headers, SECRET, now=1_800_000_000)


def test_the_event_stream_parser_reads_events_and_the_id_to_resume_from():
    parser = SSEParser()
    lines = [
        "retry: 2000",
        "",
        ": keep-alive",
        "id: 3",
        "event: progress",
        'data: {"percent": 50.0}',
        "",
        "id: 4",
        "event: status",
        'data: {"status":',
        'data: "succeeded"}',
        "",
    ]
    events = [e for e in map(parser.feed, lines) if e is not None]
    assert [(e.name, e.data, e.id) for e in events] == [
        ("progress", {"percent": 50.0}, "3"),
        ("status", {"status": "succeeded"}, "4"),
    ]
    assert parser.last_id == "4"


def test_errors_are_typed_from_the_problem_document():
    body = json.dumps(
        {"code": 422, "status": "Unprocessable Entity", "errors": {"json": {"steps": ["big"]}}}
    ).encode()
    with pytest.raises(UnprocessableEntityError) as bad:
        raise_for(422, body, {})
    assert bad.value.errors["json"]["steps"] == ["big"] and "HTTP 422" in str(bad.value)
    with pytest.raises(RateLimitError) as limited:
        raise_for(429, b'{"message": "slow down"}', {"retry-after": "7"})
    assert limited.value.retry_after == 7.0 and limited.value.message == "slow down"
    with pytest.raises(NotFoundError):
        raise_for(404, b"not json", {})
    raise_for(202, b"{}", {})  # no error


def test_every_post_gets_an_idempotency_key_and_keeps_a_given_one():
    made = headers_for("POST", None)["Idempotency-Key"]
    assert uuid.UUID(made) and headers_for("POST", {"Idempotency-Key": "k"}) == {
        "Idempotency-Key": "k"
    }
    assert "Idempotency-Key" not in headers_for("GET", None)


def test_the_client_imports_nothing_of_the_service():
    out = subprocess.run(
        [sys.executable, "-c", "import diffq.client, sys; print(' '.join(sorted(sys.modules)))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    roots = {name.split(".")[0] for name in out}
    assert not roots & {"app", "cli", "tasks", "workers", "flask", "sqlalchemy", "celery"}
    assert "httpx2" in roots


def test_a_batch_jobs_id_sorts_in_line_order_and_reads_back():
    from app.batches.ingest import line_job_id, line_of
    from app.ids import uuid7

    batch = uuid7()
    ids = [line_job_id(batch, n) for n in (1, 2, 16, 17, 4096, 50_000, 65_535)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [line_of(i) for i in ids] == [1, 2, 16, 17, 4096, 50_000, 65_535]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert line_job_id(uuid7(), 1) != ids[0]  # another batch, other ids
