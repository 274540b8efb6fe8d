"""`Prefer: wait=N` on POST /v1/jobs, through gunicorn, with a real worker."""

from __future__ import annotations

import json
import socket

import pytest
import requests

from app.web.wait import requested_wait
from testbed.jobs import auth, wait_terminal

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
    assert requested_wait("return=minimal", 60) is None
    assert requested_wait(None, 60) is None


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
