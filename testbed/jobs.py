"""Client-side helpers: submit over HTTP and wait for a terminal state."""

from __future__ import annotations

import time

import requests

TERMINAL = {"succeeded", "failed", "canceled"}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def submit(base_url: str, key: str, **body) -> dict:
    response = requests.post(f"{base_url}/v1/jobs", json=body, headers=auth(key), timeout=10)
    assert response.status_code == 202, response.text
    return response.json()


def wait_terminal(base_url: str, key: str, job_id: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        job = requests.get(f"{base_url}/v1/jobs/{job_id}", headers=auth(key), timeout=10).json()
        if job.get("status") in TERMINAL:
            return job
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id} not terminal after {timeout}s: {job}")
