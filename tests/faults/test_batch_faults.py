"""F17: a worker killed in the middle of a batch (dynamic batching, docs/batching.md).

Every job of the batch holds its own unacked message; the kill hands them all back and
each job is taken over on its own: none lost, none with two results.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from app.jobs.states import JobStatus
from tests.faults.harness import Scenario
from tests.faults.killing import kill_child

pytestmark = [pytest.mark.faults, pytest.mark.services]


def _batches(rows) -> dict[str, list]:
    """Running jobs per lease owner (one pool process), denoising."""
    owners: dict[str, list] = {}
    for row in rows.values():
        if row.status == JobStatus.RUNNING and (row.progress or {}).get("stage") == "denoising":
            owners.setdefault(row.lease_owner, []).append(row)
    return owners


def test_f17_pool_child_killed_mid_batch(fault_stack):
    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario("F17 kill -9 mid-batch", stack, stack.new_key())
    batch_sizes: list[int] = []
    deadline = time.monotonic() + 120
    while not batch_sizes and time.monotonic() < deadline:
        if sum(not r.status.terminal for r in sc.rows().values()) < 4:
            for i in range(6):  # arrive together: they can share a batch
                sc.submit(model="tiny-batch", prompt=f"f17-{i}", steps=120, seed=i)
            continue
        batches = [b for b in _batches(sc.rows()).values() if len(b) >= 2]
        if not batches:
            time.sleep(0.05)
            continue
        batch = max(batches, key=len)
        if kill_child(batch[0], sc.row):
            sc.figures.faults += 1
            batch_sizes.append(len(batch))
    rows = sc.settle(180)
    fig = sc.report(rows)
    print(f"F17: killed batches of {batch_sizes} jobs")
    assert fig.faults >= 1, "no batch of two or more jobs was seen running"
    assert fig.lost == 0, fig.line()
    assert fig.duplicate_results == 0, fig.line()
    assert fig.undelivered == 0, fig.line()
    assert fig.succeeded == len(sc.accepted), fig.line()
    # Every job of a killed batch ran again: the attempts count each takeover.
    attempts = Counter(row.attempts for row in rows.values())
    print(f"F17: jobs per attempt count {dict(sorted(attempts.items()))}")
    assert sum(row.attempts - 1 for row in rows.values()) >= sum(batch_sizes)


def test_f17b_a_job_canceled_mid_batch_leaves_it_and_the_others_finish(fault_stack):
    import requests

    from testbed.jobs import auth

    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario("F17b cancel one job mid-batch", stack, stack.new_key())
    for i in range(4):
        sc.submit(model="tiny-batch", prompt=f"f17b-{i}", steps=200, seed=i)

    def a_batch():
        batches = [b for b in _batches(sc.rows()).values() if len(b) >= 2]
        return max(batches, key=len) if batches else None

    from testbed.waiting import wait_until

    batch = wait_until(a_batch, timeout=60, interval=0.05)
    victim, others = batch[0], batch[1:]
    answer = requests.post(
        f"{stack.api.url}/v1/jobs/{victim.id}/cancel", headers=auth(sc.key), timeout=10
    )
    assert answer.status_code in (200, 202), answer.text
    sc.figures.faults += 1
    rows = sc.settle(120)
    fig = sc.report(rows)
    canceled = rows[str(victim.id)]
    print(
        f"F17b: batch of {len(batch)}; canceled at step {(canceled.progress or {}).get('step')}, "
        f"the others: {[rows[str(o.id)].status.value for o in others]}"
    )
    assert canceled.status == JobStatus.CANCELED
    assert stack.objects_of(canceled) == []  # nothing of it decoded or uploaded
    assert all(rows[str(o.id)].status == JobStatus.SUCCEEDED for o in others)
    assert fig.lost == 0 and fig.duplicate_results == 0, fig.line()
    # The batch went on without it: its companions were not run again.
    assert all(rows[str(o.id)].attempts == 1 for o in others)
