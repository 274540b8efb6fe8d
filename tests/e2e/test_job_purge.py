"""Past DIFFQ_JOB_RETENTION the relay purges finished jobs with their webhook events and
attempts; images go first (result retention), unfinished jobs stay."""

from __future__ import annotations

import sys
import uuid

import pytest
import requests
from sqlalchemy import func, select

from testbed.jobs import auth, submit, wait_terminal
from testbed.processes import ManagedProcess
from testbed.waiting import wait_until

pytestmark = pytest.mark.services


def _count(db, model, column, ids) -> int:
    with db.session() as session:
        return session.scalar(select(func.count()).select_from(model).where(column.in_(ids)))


def test_the_relay_purges_finished_jobs_and_their_webhook_rows(
    api_server, worker, tenant_key, db, stack
):
    from app.db.models.jobs import Job
    from app.db.models.webhooks import WebhookAttempt, WebhookEvent

    hook = "https://hooks.example.com/in"  # public; nothing delivers it in this stack
    done = [
        submit(api_server.url, tenant_key, prompt=f"purge-{i}", steps=2, webhook=hook)["id"]
        for i in range(3)
    ]
    for job_id in done:
        assert wait_terminal(api_server.url, tenant_key, job_id)["status"] == "succeeded"
    # No worker serves tiny-b here: this one stays queued, so it must stay.
    waiting = submit(api_server.url, tenant_key, prompt="purge-queued", model="tiny-b")["id"]
    ids = [uuid.UUID(j) for j in done]
    with db.session() as session:  # an attempt on record, as a delivery worker leaves it
        event = session.scalar(select(WebhookEvent).where(WebhookEvent.job_id == ids[0]))
        session.add(WebhookAttempt(event_id=event.id, status_code=500, latency_ms=3))
    events = _count(db, WebhookEvent, WebhookEvent.job_id, ids)
    keys = [
        o["Key"]
        for o in stack.s3.client().list_objects_v2(Bucket=stack.bucket).get("Contents", [])
        if any(j in o["Key"] for j in done)
    ]
    assert events >= 3 and len(keys) == 3

    relay = ManagedProcess(
        "relay-purge",
        [sys.executable, "-m", "cli", "relay", "--interval", "0.3"],
        {**stack.env, "DIFFQ_RESULT_RETENTION": "1", "DIFFQ_JOB_RETENTION": "2"},
        stack.logs,
    ).start()
    try:
        wait_until(lambda: _count(db, Job, Job.id, ids) == 0, timeout=60, interval=0.3)
    finally:
        relay.stop()
    print(f"\npurged 3 jobs, {events} webhook events, 1 attempt; relay: {relay.count('purged')}")
    assert _count(db, WebhookEvent, WebhookEvent.job_id, ids) == 0
    with db.session() as session:
        assert (
            session.scalar(
                select(func.count())
                .select_from(WebhookAttempt)
                .where(WebhookAttempt.event_id == event.id)
            )
            == 0
        )
    listing = stack.s3.client().list_objects_v2(Bucket=stack.bucket).get("Contents", [])
    assert not {o["Key"] for o in listing} & set(keys), "images orphaned in the store"
    gone = requests.get(f"{api_server.url}/v1/jobs/{done[0]}", headers=auth(tenant_key), timeout=5)
    assert gone.status_code == 404
    assert _count(db, Job, Job.id, [uuid.UUID(waiting)]) == 1
    requests.post(f"{api_server.url}/v1/jobs/{waiting}/cancel", headers=auth(tenant_key), timeout=5)
