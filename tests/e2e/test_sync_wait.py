"""`Prefer: wait=N` on POST /v1/jobs, through gunicorn, with a real worker."""

from __future__ import annotations

import json
import socket

import pytest
import requests

from app.web.wait import BadPreference, requested_wait
from testbed.jobs import auth, wait_terminal
from testbed.waiting import wait_until

pytestmark = pytest.mark.services


def _post(api_server, key, body, prefer=None, timeout=30, **headers):
    if prefer:
        headers["Prefer"] = prefer
    return requests.post(
        f"{api_server.url}/v1/jobs", json=body, headers={**auth(key), **headers}, timeout=timeout
    )


def _job_count(api_server, key) -> int:
    page = requests.get(f"{api_server.url}/v1/jobs?limit=100", headers=auth(key), timeout=10)
    return len(page.json()["data"])


def test_prefer_wait_header_parsing():
    assert requested_wait("wait=10", 60) == 10
    assert requested_wait("respond-async, wait=100", 60) == 60
    assert requested_wait('handling=lenient; wait="5"', 60) == 5
    assert requested_wait("WAIT = 7", 60) == 7
    assert requested_wait("wait=0", 60) == 0
    assert requested_wait("return=minimal", 60) is None
    assert requested_wait("waiting=5", 60) is None  # another preference
    assert requested_wait(None, 60) is None
    for bad in ("wait=abc", "wait=-5", "wait=", "wait", "wait=1.5", 'wait="x"', "wait=٣"):
        with pytest.raises(BadPreference, match="whole number of seconds"):
            requested_wait(bad, 60)


def test_a_fast_job_is_answered_finished_with_200(api_server, worker, tenant_key):
    response = _post(api_server, tenant_key, {"prompt": "sync", "steps": 2}, prefer="wait=30")
    assert response.status_code == 200, response.text
    assert response.headers["Preference-Applied"] == "wait=30"
    job = response.json()
    assert job["status"] == "succeeded" and job["result"]["images"][0]["url"]
    assert response.headers["Location"].endswith(job["id"])
    assert _job_count(api_server, tenant_key) == 1


def test_a_job_not_done_in_time_is_a_202_and_the_same_single_job(api_server, tenant_key):
    # No worker consumes tiny-b here: the job stays queued past the wait.
    body = {"prompt": "slow", "model": "tiny-b", "steps": 2}
    response = _post(api_server, tenant_key, body, prefer="wait=1", **{"Idempotency-Key": "w1"})
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "queued"
    again = _post(api_server, tenant_key, body, prefer="wait=1", **{"Idempotency-Key": "w1"})
    assert again.status_code == 202 and again.json()["id"] == response.json()["id"]
    assert _job_count(api_server, tenant_key) == 1
    requests.post(response.json()["urls"]["cancel"], headers=auth(tenant_key), timeout=10)


def test_a_client_that_hangs_up_while_waiting_leaves_the_job_running(
    api_server, worker, tenant_key
):
    body = json.dumps({"prompt": "gone", "steps": 10}).encode()
    with socket.create_connection(("127.0.0.1", api_server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {tenant_key}\r\nPrefer: wait=60\r\n".encode()
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        listed: list = []
        while not listed:  # hang up as soon as the job exists, without reading the answer
            listed = requests.get(
                f"{api_server.url}/v1/jobs", headers=auth(tenant_key), timeout=10
            ).json()["data"]
    assert len(listed) == 1
    job = wait_terminal(api_server.url, tenant_key, listed[0]["id"])
    assert job["status"] == "succeeded", job["error"]


def test_a_bad_prefer_header_is_a_422_naming_it(api_server, tenant_key):
    response = _post(api_server, tenant_key, {"prompt": "x"}, prefer="wait=" + "9" * 300)
    assert response.status_code == 422
    assert "Prefer" in response.json()["errors"]["headers"]


@pytest.mark.parametrize("prefer", ["wait=abc", "wait=-5", "respond-async, wait="])
def test_a_wait_that_is_no_number_is_a_422_naming_prefer_and_stores_nothing(
    api_server, tenant_key, prefer
):
    response = _post(api_server, tenant_key, {"prompt": "x"}, prefer=prefer)
    assert response.status_code == 422, response.text
    assert "whole number of seconds" in response.json()["errors"]["headers"]["Prefer"][0]
    assert _job_count(api_server, tenant_key) == 0


def _worker_idle(db) -> None:
    from sqlalchemy import func, select

    from app.db.models.jobs import Job
    from app.jobs.states import JobStatus

    def idle() -> bool:
        with db.session() as session:
            busy = session.scalar(
                select(func.count())
                .select_from(Job)
                .where(
                    Job.queue == "gpu.tiny", Job.status.in_([JobStatus.RUNNING, JobStatus.QUEUED])
                )
            )
        return busy == 0

    wait_until(idle, timeout=120, interval=0.2)


def test_a_wait_that_runs_out_answers_the_job_as_it_is_then(api_server, worker, tenant_key, db):
    """Not the queued job it was when submitted: it started meanwhile."""
    _worker_idle(db)  # so the job starts within the wait
    body = {"prompt": "long", "steps": 500, "width": 256, "height": 192, "num_images": 3}
    response = _post(api_server, tenant_key, body, prefer="wait=4")
    try:
        assert response.status_code == 202, response.text
        assert "Preference-Applied" not in response.headers
        job = response.json()
        now = requests.get(job["urls"]["self"], headers=auth(tenant_key), timeout=10).json()
        assert now["status"] == "running", now  # it started within the wait and runs on
        assert job["status"] == "running", job
        assert job["started_at"] is not None and job["started_at"] == now["started_at"]
        assert job["progress"]["stage"] != "queued", job["progress"]
    finally:
        requests.post(response.json()["urls"]["cancel"], headers=auth(tenant_key), timeout=10)
