"""Cancel: a queued job never runs; a running job stops at the next step and frees its GPU."""

from __future__ import annotations

import re
from datetime import datetime

import pytest
import requests

from testbed.jobs import auth, submit, wait_terminal
from testbed.processes import start_worker
from testbed.waiting import wait_until

pytestmark = pytest.mark.services


def cancel(api_server, key, job_id) -> requests.Response:
    return requests.post(f"{api_server.url}/v1/jobs/{job_id}/cancel", headers=auth(key), timeout=10)


def get(api_server, key, job_id) -> dict:
    return requests.get(f"{api_server.url}/v1/jobs/{job_id}", headers=auth(key), timeout=10).json()


def test_a_queued_job_is_canceled_at_once_and_its_message_discarded(api_server, tenant_key, stack):
    job = submit(api_server.url, tenant_key, prompt="never", model="tiny-b", steps=2)
    response = cancel(api_server, tenant_key, job["id"])
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "canceled" and body["error"]["code"] == "canceled"
    assert cancel(api_server, tenant_key, job["id"]).status_code == 409

    worker_b = start_worker(stack.env, stack.logs, "worker-tiny-b-cancel", models="tiny-b")
    try:
        worker_b.wait_for_log(rf"job {job['id']} not run: finished \(canceled\)", timeout=30)
    finally:
        worker_b.stop()
    after = get(api_server, tenant_key, job["id"])
    assert after["status"] == "canceled"
    assert after["attempts"] == 0 and after["started_at"] is None


def test_a_running_job_stops_at_the_next_step_and_the_worker_takes_the_next_job(
    api_server, worker, tenant_key
):
    total_steps = 400
    # Steps of a few tens of ms, so that the 50 ms progress writes lag it by a step or two.
    long_job = submit(
        api_server.url, tenant_key, prompt="long", steps=total_steps, width=256, height=192
    )
    wait_until(
        lambda: get(api_server, tenant_key, long_job["id"])["progress"]["step"] >= 3, timeout=60
    )
    asked = datetime.now().astimezone()
    response = cancel(api_server, tenant_key, long_job["id"])
    assert response.status_code == 200 and response.json()["status"] == "canceled"
    step_at_cancel = response.json()["progress"]["step"]
    pace = response.json()["progress"]["seconds_per_step"]  # the worker's, measured
    quick = submit(api_server.url, tenant_key, prompt="next", steps=2)

    done = wait_terminal(api_server.url, tenant_key, quick["id"], timeout=60)
    assert done["status"] == "succeeded"
    started = datetime.fromisoformat(done["started_at"])
    latency = (started - asked).total_seconds()
    stopped = re.search(rf"job {long_job['id']} stopped at step (\d+)", worker.log())
    assert stopped, "the worker did not report stopping the canceled job"
    stop_step = int(stopped.group(1))
    print(
        f"\ncancel of a running job: asked at step {step_at_cancel}, stopped at step "
        f"{stop_step} of {total_steps}; next job started {latency * 1000:.0f} ms after the request"
    )
    assert stop_step < total_steps
    # Progress is written every 50 ms here (~2 steps), so the row lags the worker a little.
    assert stop_step - step_at_cancel <= 6
    # The next job started well before the canceled one would have ended, at its own pace
    # (a bound in its steps, not in seconds: a slow machine slows both alike).
    unstopped = (total_steps - step_at_cancel) * pace
    assert latency < unstopped / 4, f"{latency:.1f} s, against {unstopped:.1f} s unstopped"
    final = get(api_server, tenant_key, long_job["id"])
    assert final["status"] == "canceled" and final["result"] is None


def test_canceling_a_finished_job_is_409_and_a_foreign_job_is_404(
    api_server, worker, tenant_key, other_key
):
    job = submit(api_server.url, tenant_key, prompt="quick", steps=1)
    assert wait_terminal(api_server.url, tenant_key, job["id"])["status"] == "succeeded"
    response = cancel(api_server, tenant_key, job["id"])
    assert response.status_code == 409
    assert "already succeeded" in response.json()["message"]
    assert cancel(api_server, other_key, job["id"]).status_code == 404
