"""Idempotency-Key makes retries safe; cancel_after keeps stale jobs off the GPU."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from sqlalchemy import func, select

from testbed.jobs import auth, submit, wait_terminal
from testbed.processes import start_worker

pytestmark = pytest.mark.services


def post(api_server, key, body, idempotency_key=None) -> requests.Response:
    headers = auth(key)
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    return requests.post(f"{api_server.url}/v1/jobs", json=body, headers=headers, timeout=30)


def rows_with_key(db, key: str) -> int:
    from app.db.models.jobs import Job

    with db.session() as session:
        return session.scalar(
            select(func.count()).select_from(Job).where(Job.idempotency_key == key)
        )


def test_the_same_key_and_body_return_the_original_job(api_server, worker, tenant_key, db):
    key, body = str(uuid.uuid4()), {"prompt": "once", "steps": 2}
    first = post(api_server, tenant_key, body, key)
    second = post(api_server, tenant_key, body, key)
    assert first.status_code == second.status_code == 202
    assert first.json()["id"] == second.json()["id"]
    assert "Idempotent-Replayed" not in first.headers
    assert second.headers["Idempotent-Replayed"] == "true"
    assert rows_with_key(db, key) == 1


def test_the_same_key_with_another_body_is_409(api_server, worker, tenant_key):
    key = str(uuid.uuid4())
    assert post(api_server, tenant_key, {"prompt": "a", "steps": 2}, key).status_code == 202
    conflict = post(api_server, tenant_key, {"prompt": "b", "steps": 2}, key)
    assert conflict.status_code == 409
    assert key in conflict.json()["message"]


def test_keys_belong_to_a_tenant(api_server, worker, tenant_key, other_key):
    key, body = str(uuid.uuid4()), {"prompt": "mine", "steps": 1}
    ours = post(api_server, tenant_key, body, key).json()["id"]
    theirs = post(api_server, other_key, body, key).json()["id"]
    assert ours != theirs


def test_twenty_concurrent_submits_with_one_key_make_one_job(api_server, worker, tenant_key, db):
    key, body = str(uuid.uuid4()), {"prompt": "stampede", "steps": 2, "seed": 3}
    with ThreadPoolExecutor(20) as pool:
        responses = list(pool.map(lambda _: post(api_server, tenant_key, body, key), range(20)))
    assert [r.status_code for r in responses] == [202] * 20
    ids = {r.json()["id"] for r in responses}
    replayed = sum(r.headers.get("Idempotent-Replayed") == "true" for r in responses)
    print(f"\n20 concurrent submits, one key: {len(ids)} job, {replayed} replayed answers")
    assert len(ids) == 1 and replayed == 19
    assert rows_with_key(db, key) == 1
    [job_id] = ids
    assert wait_terminal(api_server.url, tenant_key, job_id)["attempts"] == 1
    assert worker.count(rf"job {job_id} succeeded") == 1


@pytest.mark.parametrize("header", ["", "k" * 256])
def test_a_bad_idempotency_key_is_422(api_server, tenant_key, header):
    response = post(api_server, tenant_key, {"prompt": "x"}, header)
    assert response.status_code == 422
    assert "Idempotency-Key" in response.json()["errors"]["headers"]


@pytest.mark.parametrize("value", [0, -5, 7 * 24 * 3600 + 1, "10"])
def test_cancel_after_is_validated(api_server, tenant_key, value):
    response = post(api_server, tenant_key, {"prompt": "x", "cancel_after": value})
    assert response.status_code == 422
    assert "cancel_after" in response.json()["errors"]["json"]


def test_a_job_past_its_deadline_is_canceled_when_delivered_and_never_runs(
    api_server, tenant_key, stack
):
    job = submit(api_server.url, tenant_key, prompt="stale", model="tiny-b", cancel_after=1)
    time.sleep(1.3)
    worker_b = start_worker(stack.env, stack.logs, "worker-tiny-b-deadline", models="tiny-b")
    try:
        worker_b.wait_for_log(rf"job {job['id']} not run: expired", timeout=30)
    finally:
        worker_b.stop()
    done = wait_terminal(api_server.url, tenant_key, job["id"])
    assert done["status"] == "canceled" and done["error"]["code"] == "deadline"
    assert done["attempts"] == 0 and done["started_at"] is None


def test_the_relay_cancels_expired_jobs_even_with_no_worker(api_server, tenant_key, db):
    from app.housekeeping.deadlines import cancel_expired

    job = submit(api_server.url, tenant_key, prompt="orphan", model="tiny-b", cancel_after=1)
    fresh = submit(api_server.url, tenant_key, prompt="fresh", model="tiny-b", cancel_after=600)
    time.sleep(1.3)
    assert cancel_expired(db) >= 1
    done = wait_terminal(api_server.url, tenant_key, job["id"], timeout=5)
    assert done["status"] == "canceled" and done["error"]["code"] == "deadline"
    still = requests.get(
        f"{api_server.url}/v1/jobs/{fresh['id']}", headers=auth(tenant_key), timeout=5
    ).json()
    assert still["status"] == "queued"
    requests.post(f"{api_server.url}/v1/jobs/{fresh['id']}/cancel", headers=auth(tenant_key))


def test_a_running_job_past_its_deadline_stops_at_its_next_step(api_server, worker, tenant_key, db):
    """cancel_after bounds the whole job, not only its start: the relay's deadline pass
    cancels a running job too, and its worker stops it at the next step (nothing decoded,
    no result) and takes the next job."""
    from app.housekeeping.deadlines import cancel_expired
    from testbed.waiting import wait_until

    # The largest size at the most steps: tens of seconds on a CPU, far past its deadline.
    body = {"prompt": "too long", "width": 256, "height": 192, "steps": 500, "seed": 2}
    job = submit(api_server.url, tenant_key, **body, cancel_after=3)

    def running_at_a_step():
        now = requests.get(
            f"{api_server.url}/v1/jobs/{job['id']}", headers=auth(tenant_key), timeout=5
        ).json()
        return now if now["status"] == "running" and now["progress"]["step"] > 0 else None

    wait_until(running_at_a_step, timeout=60)
    time.sleep(3.5)  # past its deadline, still running
    assert cancel_expired(db) >= 1
    done = wait_terminal(api_server.url, tenant_key, job["id"], timeout=10)
    print(f"canceled at step {done['progress']['step']} of 500: {done['error']}")
    assert done["status"] == "canceled" and done["error"]["code"] == "deadline"
    assert done["started_at"] is not None and done["result"] is None
    assert done["progress"]["step"] < 500
    worker.wait_for_log(rf"job {job['id']} stopped at step \d+: no longer held", timeout=30)
    after = submit(api_server.url, tenant_key, prompt="next", steps=2, seed=3)
    assert wait_terminal(api_server.url, tenant_key, after["id"])["status"] == "succeeded"
