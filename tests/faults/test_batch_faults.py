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
    while len(batch_sizes) < 2 and time.monotonic() < deadline:
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
            time.sleep(1.0)  # let the next batch form before picking another
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
