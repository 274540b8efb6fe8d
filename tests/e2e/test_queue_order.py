"""Queue position and ETA under a real backlog; priorities; low jobs do not starve."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
import requests

from testbed.jobs import auth, submit, wait_terminal
from testbed.processes import start_worker
from testbed.waiting import wait_until

pytestmark = pytest.mark.services


def get(api_server, key, job_id) -> dict:
    return requests.get(f"{api_server.url}/v1/jobs/{job_id}", headers=auth(key), timeout=10).json()


# The tiny model's steps are cheap at 64 x 64 (its VAE downsamples by 8): jobs that must
# hold the worker while others queue use the catalog's largest size.
LONGER = {"width": 256, "height": 192}


def _start_order(api_server, key, jobs) -> list[str]:
    done = [wait_terminal(api_server.url, key, j["id"], timeout=120) for j in jobs]
    assert all(j["status"] == "succeeded" for j in done), done
    return [j["id"] for j in sorted(done, key=lambda j: datetime.fromisoformat(j["started_at"]))]


def test_queued_jobs_report_their_position_and_an_honest_eta(api_server, worker, tenant_key):
    # History for the estimate: the model has finished jobs of two sizes.
    for steps in (2, 20):
        job = submit(api_server.url, tenant_key, prompt="history", steps=steps, **LONGER)
        wait_terminal(api_server.url, tenant_key, job["id"])
    blocker = submit(api_server.url, tenant_key, prompt="blocker", steps=120, **LONGER)
    # Past its first steps the running job's pace is steady, and each queued job adds
    # more to the estimate than that pace jitters between two reads.
    wait_until(lambda: get(api_server, tenant_key, blocker["id"])["progress"]["step"] >= 15)
    backlog = [
        submit(api_server.url, tenant_key, prompt=f"b{i}", steps=60, **LONGER) for i in range(4)
    ]

    asked = datetime.now().astimezone()
    views = [get(api_server, tenant_key, job["id"]) for job in backlog]
    positions = [v["queue_position"] for v in views]
    etas = [v["eta_seconds"] for v in views]
    assert positions == [0, 1, 2, 3]
    assert all(eta is not None and eta > 0 for eta in etas)
    assert etas == sorted(etas) and etas[-1] > etas[0]
    running = get(api_server, tenant_key, blocker["id"])
    assert running["queue_position"] is None
    progress = running["progress"]
    if running["status"] == "running" and 0 < progress["step"] < progress["total_steps"]:
        # Its own time left, at its pace so far: (elapsed / step) x steps left.
        assert running["eta_seconds"] is not None and running["eta_seconds"] > 0, running

    ended = wait_terminal(api_server.url, tenant_key, blocker["id"], timeout=60)
    # The worker takes the next job a moment after the blocker's end is recorded (or
    # before it): once the first of the backlog has left the queue, the last moves up.
    wait_until(
        lambda: get(api_server, tenant_key, backlog[0]["id"])["status"] != "queued",
        timeout=60,
        what="the first queued job started after the blocker",
    )
    last = get(api_server, tenant_key, backlog[-1]["id"])
    assert last["status"] != "queued" or last["queue_position"] < 3
    _start_order(api_server, tenant_key, backlog)
    actual = [
        (
            datetime.fromisoformat(get(api_server, tenant_key, j["id"])["started_at"]) - asked
        ).total_seconds()
        for j in backlog
    ]
    # The machine's speed moves with the suite's other processes, and an estimate is made
    # at the speed of its moment: it is judged at that speed. The blocker's pace from the
    # estimate to its end, against the pace it reported then, is the change.
    finished = datetime.fromisoformat(ended["finished_at"])
    steps_left = progress["total_steps"] - progress["step"]
    paced = progress.get("seconds_per_step")
    change = 1.0
    if running["status"] == "running" and paced and steps_left > 0:
        change = (finished - asked).total_seconds() / steps_left / paced
    print(f"\npositions {positions}\neta_seconds     {etas}")
    print(f"actual seconds  {[round(a, 1) for a in actual]}; the machine's pace x{change:.2f}")
    # An estimate, but an honest one: within a factor of two of what happened.
    for eta, real in zip(etas, actual, strict=True):
        assert real / 2 <= eta * change <= real * 2 + 0.5, (etas, actual, change)


def test_a_high_priority_job_starts_before_a_normal_backlog(api_server, worker, tenant_key):
    blocker = submit(api_server.url, tenant_key, prompt="blocker", steps=60, **LONGER)
    wait_until(lambda: get(api_server, tenant_key, blocker["id"])["status"] == "running")
    normals = [submit(api_server.url, tenant_key, prompt=f"n{i}", steps=2) for i in range(4)]
    high = submit(api_server.url, tenant_key, prompt="urgent", steps=2, priority="high")
    assert get(api_server, tenant_key, high["id"])["queue_position"] == 0

    order = _start_order(api_server, tenant_key, [blocker, *normals, high])
    names = {blocker["id"]: "blocker", high["id"]: "high"}
    names.update({job["id"]: f"normal{i}" for i, job in enumerate(normals)})
    observed = [names[job_id] for job_id in order]
    print(f"\nobserved start order: {observed}")
    assert observed == ["blocker", "high", "normal0", "normal1", "normal2", "normal3"]


def test_a_long_waiting_low_job_ages_up_past_newer_normal_jobs(api_server, tenant_key, stack, db):
    from app.config import load_settings
    from app.housekeeping.aging import promote_starving
    from app.services import Services

    low = submit(api_server.url, tenant_key, prompt="patient", model="tiny-b", priority="low")
    wait_until(lambda: get(api_server, tenant_key, low["id"])["queue_position"] is not None)
    time.sleep(1.2)
    normals = [submit(api_server.url, tenant_key, prompt=f"n{i}", model="tiny-b") for i in range(3)]
    assert get(api_server, tenant_key, low["id"])["queue_position"] == 3  # behind them all

    publisher = Services(load_settings()).publisher  # a root of its own
    # Waited 1.2 s at 0.5 s per level: low -> normal -> high. The normals (fresh) stay.
    assert promote_starving(db, publisher, aging_seconds=0.5) >= 1
    assert get(api_server, tenant_key, low["id"])["queue_position"] == 0

    worker_b = start_worker(stack.env, stack.logs, "worker-tiny-b-aging", models="tiny-b")
    try:
        order = _start_order(api_server, tenant_key, [low, *normals])
        # The low job's first (low-priority) message arrives last and is dropped unrun.
        worker_b.wait_for_log(rf"job {low['id']} not run: finished", timeout=30)
    finally:
        worker_b.stop()
    assert order[0] == low["id"]
    assert get(api_server, tenant_key, low["id"])["attempts"] == 1
