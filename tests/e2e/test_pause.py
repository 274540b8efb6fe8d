"""An operator pauses a model and resumes it, through the API with an operator's key, in
both modes (PostgreSQL, RabbitMQ and S3 with a worker; `diffq up`'s embedded stores): the
worker stops consuming the model's queue, jobs submitted meanwhile wait in their places
with no ETA, a tenant's key may not pause, and once resumed every job runs once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
import requests

from testbed.embedded import clean_env
from testbed.jobs import auth, submit, wait_terminal
from testbed.waiting import wait_until

pytestmark = pytest.mark.services


def _operator_key(served, request) -> str:
    if served.mode == "embedded":
        return served.api.new_key("ops", operator=True)
    from app.keys import create_key, get_or_create_tenant

    with request.getfixturevalue("db").session() as session:
        tenant = get_or_create_tenant(session, f"ops-{uuid.uuid4().hex[:12]}")
        return create_key(session, tenant, "ops", operator=True)


def _diffq(served, *args: str) -> str:
    """A `diffq` command as the operator runs it beside this service."""
    env = dict(os.environ) if served.mode == "production" else clean_env(served.api.home)
    done = subprocess.run(
        [sys.executable, "-m", "cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _consumers(served, queue: str) -> int | None:
    for line in _diffq(served, "queues", "--json").splitlines():
        row = json.loads(line)
        if row["queue"] == queue:
            return row["queue_consumers"]
    return None


def _pause(url: str, key: str, model: str = "tiny", **body) -> requests.Response:
    return requests.put(f"{url}/v1/models/{model}/pause", json=body, headers=auth(key), timeout=10)


def test_a_paused_model_keeps_its_jobs_waiting_in_place_until_it_is_resumed(served, request):
    url, ops = served.api.url, _operator_key(served, request)
    assert _pause(url, served.key).status_code == 403  # a tenant's key
    missing = _pause(url, ops, model="nope")
    assert missing.status_code == 404 and "known:" in missing.json()["message"]
    bad = _pause(url, ops, now="soon", reason="x" * 201)
    assert bad.status_code == 422 and set(bad.json()["errors"]["json"]) == {"now", "reason"}
    try:
        paused = _pause(url, ops, reason="driver upgrade")
        assert paused.status_code == 200, paused.text
        assert paused.json()["model"] == "tiny" and paused.json()["now"] is False
        models = requests.get(f"{url}/v1/models", headers=auth(served.key), timeout=10).json()
        (tiny,) = [m for m in models["data"] if m["name"] == "tiny"]
        assert tiny["paused"]["reason"] == "driver upgrade"
        wait_until(lambda: _consumers(served, "gpu.tiny") == 0, timeout=60, what="no consumer")

        jobs = [
            submit(url, served.key, prompt=f"paused {i}", width=64, height=64, steps=2, seed=i)
            for i in range(3)
        ]
        views = [
            requests.get(f"{url}/v1/jobs/{j['id']}", headers=auth(served.key), timeout=10).json()
            for j in jobs
        ]
        positions = [v["queue_position"] for v in views]
        print(f"{served.mode}: while paused, positions {positions}")
        assert [v["status"] for v in views] == ["queued"] * 3
        assert all(v["paused"] is True and v["eta_seconds"] is None for v in views)
        assert positions == sorted(set(positions))  # each in its own place, in order
        estimate = requests.get(
            f"{url}/v1/models/tiny/estimate", headers=auth(served.key), timeout=10
        ).json()
        assert estimate["paused"] is True and estimate["queue_seconds"] is None
        listed = _diffq(served, "queue", "list").splitlines()
        (line,) = [row for row in listed if row.split()[0] == "tiny"]
        assert line.split()[1] == "paused" and int(line.split()[2]) >= len(jobs)
        assert "driver upgrade" in line
    finally:
        resumed = requests.delete(f"{url}/v1/models/tiny/pause", headers=auth(ops), timeout=10)
    assert resumed.status_code == 204
    done = [wait_terminal(url, served.key, j["id"], timeout=120) for j in jobs]
    print(f"{served.mode}: resumed: {[d['status'] for d in done]}")
    assert [d["status"] for d in done] == ["succeeded"] * 3
    assert all(d["attempts"] == 1 for d in done)
    assert wait_until(lambda: _consumers(served, "gpu.tiny"), timeout=60, what="consumed again")
