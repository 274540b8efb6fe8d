"""Routing by model, duplicate deliveries, and publishing that outlives a broker failure."""

from __future__ import annotations

import time
import uuid

import pytest
import requests

from testbed.jobs import auth, submit, wait_terminal
from testbed.processes import start_worker
from testbed.services import queue_state

pytestmark = pytest.mark.services


def _job_row(db, job_id):
    from app.db.models.jobs import Job

    with db.session() as session:
        return session.get(Job, uuid.UUID(job_id))


def _publisher(**celery_overrides):
    """A publisher of its own root (the process's stays untouched), its Celery app with
    `celery_overrides`."""
    from app.broker.celery import create_celery
    from app.broker.publish import Publisher
    from app.config import load_settings
    from app.services import Services

    root = Services(load_settings())
    app = create_celery(lambda: root, **celery_overrides)
    return Publisher(root.catalog, broker=root.broker, celery_app=app, timeout=2.0)


def test_a_job_waits_on_its_models_queue_for_a_worker_that_serves_it(
    api_server, worker, tenant_key, stack
):
    waiting_before, consumers = queue_state(stack.broker_url, "gpu.tiny-b")
    assert consumers == 0
    job = submit(api_server.url, tenant_key, prompt="routed", model="tiny-b", steps=2)
    time.sleep(1.0)  # ample time for the tiny worker to take it, were it misrouted
    assert queue_state(stack.broker_url, "gpu.tiny-b") == (waiting_before + 1, 0)
    still = requests.get(
        f"{api_server.url}/v1/jobs/{job['id']}", headers=auth(tenant_key), timeout=5
    )
    assert still.json()["status"] == "queued"
    worker_b = start_worker(stack.env, stack.logs, "worker-tiny-b", models="tiny-b")
    try:
        done = wait_terminal(api_server.url, tenant_key, job["id"])
    finally:
        worker_b.stop()
    assert done["status"] == "succeeded" and done["model"] == "tiny-b"
    assert f"job {job['id']} succeeded" in worker_b.log()
    assert job["id"] not in worker.log()


def test_a_duplicate_message_for_a_succeeded_job_does_not_generate_again(
    api_server, worker, tenant_key, stack, db
):
    job = submit(api_server.url, tenant_key, prompt="only once", steps=2, seed=5)
    done = wait_terminal(api_server.url, tenant_key, job["id"])
    assert done["status"] == "succeeded"
    key = _job_row(db, job["id"]).result["images"][0]["key"]
    before = stack.s3.client().head_object(Bucket=stack.bucket, Key=key)

    publisher = _publisher()
    row = _job_row(db, job["id"])
    assert publisher.publish(row) and publisher.publish(row)
    worker.wait_for_log(rf"job {job['id']} not run: finished", count=2, timeout=30)

    again = _job_row(db, job["id"])
    assert again.attempts == 1
    assert again.finished_at == _job_row(db, job["id"]).finished_at == row.finished_at
    after = stack.s3.client().head_object(Bucket=stack.bucket, Key=key)
    assert after["LastModified"] == before["LastModified"] and after["ETag"] == before["ETag"]
    assert worker.count(rf"job {job['id']} succeeded") == 1


def test_a_job_whose_publish_failed_is_published_by_the_relay(
    api_server, worker, tenant_key, stack, db
):
    from app.broker.publish import publish_and_mark
    from app.housekeeping.outbox import publish_unpublished

    job = submit(api_server.url, tenant_key, prompt="relayed", steps=2)
    wait_terminal(api_server.url, tenant_key, job["id"])
    # A second job committed while the broker is unreachable (nothing listens there).
    from app.jobs import service
    from app.jobs.states import Priority
    from app.kinds import request_from_stored

    params = dict(job["input"], seed=9)
    tenant_id = _job_row(db, job["id"]).tenant_id
    with db.session() as session:
        row = service.create_job(
            session,
            tenant_id,
            model="tiny",
            queue="gpu.tiny",
            priority=Priority.NORMAL,
            request=request_from_stored(params),
            metadata=None,
        )
    dead = _publisher(broker_url="amqp://guest:guest@127.0.0.1:1//")
    started = time.monotonic()
    assert publish_and_mark(db, dead, row) is False
    assert time.monotonic() - started < 10
    assert _job_row(db, str(row.id)).published_at is None

    assert publish_unpublished(db, _publisher(), older_than_seconds=0) >= 1
    assert _job_row(db, str(row.id)).published_at is not None
    done = wait_terminal(api_server.url, _key_of(db, tenant_id), str(row.id))
    assert done["status"] == "succeeded"


def _key_of(db, tenant_id) -> str:
    from app.db.models.tenants import Tenant
    from app.keys import create_key

    with db.session() as session:
        return create_key(session, session.get(Tenant, tenant_id), "relay test")
