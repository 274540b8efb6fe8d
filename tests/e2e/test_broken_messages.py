"""Broken messages put straight into a GPU queue (not through the API): each ends in the
dead-letter queue or is discarded with a log line, and the worker goes on serving."""

from __future__ import annotations

import json
import uuid

import pytest

from testbed.jobs import submit, wait_terminal
from testbed.services import broker_connection, queue_state

pytestmark = pytest.mark.services

QUEUE = "gpu.tiny"


def _celery_message(conn, body: bytes, *, task: str | None = "diffq.generate") -> None:
    """Publish like Celery's protocol 2 would (or, without `task`, like nothing that
    knows the protocol)."""
    headers = {"task": task, "id": str(uuid.uuid4()), "lang": "py"} if task else {}
    conn.Producer().publish(
        body,
        exchange="diffq.jobs",
        routing_key=QUEUE,
        headers=headers,
        content_type="application/json",
        content_encoding="utf-8",
        delivery_mode=2,
        serializer=None,
    )


def _args(payload) -> bytes:
    return json.dumps([[payload], {}, {"callbacks": None, "errbacks": None}]).encode()


def _v1(job_id: str, **params) -> dict:
    return {"v": 1, "job_id": job_id, "tenant": str(uuid.uuid4()), "params": params}


def test_broken_messages_are_dead_lettered_or_discarded_and_the_worker_goes_on(
    api_server, worker, tenant_key, stack
):
    dlq = f"{QUEUE}.dlq"
    dead_before, _ = queue_state(stack.broker_url, dlq)
    missing = str(uuid.uuid4())
    huge = str(uuid.uuid4())
    wrong_version = str(uuid.uuid4())
    with broker_connection(stack.broker_url) as conn:
        _celery_message(conn, b'[[{"v": 1, "job_id": ')  # not JSON
        _celery_message(conn, _args({**_v1(wrong_version), "v": 99}))
        _celery_message(conn, _args(_v1(missing, prompt="x")))
        _celery_message(conn, _args(_v1(huge, prompt="z" * 4_000_000)))  # 4 MB
        _celery_message(conn, _args("just a string"))
        _celery_message(conn, b'{"hello": "world"}', task=None)  # not a task at all
    # Each one is answered by the worker's log:
    worker.wait_for_log(r"(?i)can't decode message body", timeout=60)
    worker.wait_for_log(r"dead-lettering a broken message: unsupported payload version 99")
    worker.wait_for_log(rf"job {missing} not run: missing")
    worker.wait_for_log(rf"job {huge} not run: missing")
    worker.wait_for_log(r"dead-lettering a broken message: payload is a str")
    worker.wait_for_log(r"(?i)unknown message|received and deleted unknown")
    # ... and the worker still serves.
    job = submit(api_server.url, tenant_key, prompt="after the broken ones", steps=2)
    assert wait_terminal(api_server.url, tenant_key, job["id"])["status"] == "succeeded"
    dead_after, _ = queue_state(stack.broker_url, dlq)
    print(f"\nbroken messages: {dead_after - dead_before} dead-lettered, the rest logged")
    assert dead_after - dead_before >= 2  # the wrong version and the string payload


def test_a_version_1_message_from_before_an_upgrade_runs_its_job_from_the_row(
    worker, tenant_key, db, stack
):
    """Version 1 messages carried the request as `params`: one still queued when the
    workers are upgraded runs the job as its row says, whatever its params say."""
    from sqlalchemy import select

    from app.db.models.jobs import Job
    from app.db.models.tenants import ApiKey
    from app.db.types import utcnow
    from app.jobs.service import create_job
    from app.jobs.states import JobStatus, Priority
    from app.kinds import request_from_stored
    from testbed.waiting import wait_until

    row_input = {
        "prompt": "from the row",
        "negative_prompt": None,
        "model": "tiny",
        "width": 64,
        "height": 64,
        "steps": 2,
        "guidance_scale": 7.5,
        "seed": 5,
        "num_images": 1,
        "scheduler": "default",
        "output_format": "png",
        "priority": "normal",
    }
    key_id = tenant_key.split("_")[1]
    with db.session() as session:
        tenant_id = session.scalar(select(ApiKey.tenant_id).where(ApiKey.key_id == key_id))
        job = create_job(
            session,
            tenant_id,
            model="tiny",
            queue=QUEUE,
            priority=Priority.NORMAL,
            request=request_from_stored(row_input),
            metadata=None,
        )
        job.published_at = utcnow()  # its message is the one below: no second publish
        job_id = str(job.id)
    message = {
        "v": 1,
        "job_id": job_id,
        "tenant": str(tenant_id),
        "params": {**row_input, "prompt": "from the message", "steps": 9},
    }
    with broker_connection(stack.broker_url) as conn:
        _celery_message(conn, _args(message))

    def finished():
        with db.session() as session:
            row = session.get(Job, job.id)
            return row if row.status.terminal else None

    row = wait_until(finished, timeout=60)
    assert row.status == JobStatus.SUCCEEDED, (row.error_code, row.error_message)
    assert row.input["prompt"] == "from the row"
    assert row.progress["total_steps"] == 2  # the row's steps ran, not the message's 9
