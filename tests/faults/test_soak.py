"""The fault mix for as long as asked: `bench/soak.py --faults 2000` runs this with
DIFFQ_SOAK_FAULTS set; the default run skips it (the suite has its own fault budget)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from app.jobs.states import JobStatus
from tests.faults.harness import Scenario
from tests.faults.killing import kill_child
from tests.faults.test_crash_faults import TERMINATE_APP_BACKENDS
from tests.faults.test_service_faults import SteadyLoad

pytestmark = [pytest.mark.faults, pytest.mark.services]


def _tree(pid: int) -> list[int]:
    """The process and its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def memory(stack) -> dict[str, float]:
    """Resident memory (MiB) of each service process tree: API, relay, webhook deliverer,
    each worker (its main process and pool processes together)."""
    named = {"api": stack.api, "relay": stack.relay, "webhooks": stack.deliverer}
    named.update({f"worker-{n}": w for n, w in stack.workers.items()})
    return {
        name: round(sum(_rss_mib(p) for p in _tree(proc.pid)), 1)
        for name, proc in named.items()
        if proc is not None
    }


def test_soak_the_fault_mix(fault_stack):
    target = int(os.environ.get("DIFFQ_SOAK_FAULTS", "0"))
    if target <= 0:
        pytest.skip("soak run only: set DIFFQ_SOAK_FAULTS (bench/soak.py does)")
    period = float(os.environ.get("DIFFQ_SOAK_SUBMIT_PERIOD", "0.5"))
    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario(f"soak: {target} faults", stack, stack.new_key())
    at_start = memory(stack)
    kills = storms = 0
    with SteadyLoad(sc, period, prompt="soak", steps=12):
        while sc.figures.faults < target:
            running = [
                row
                for row in sc.rows().values()
                if row.status == JobStatus.RUNNING
                and (row.progress or {}).get("stage") == "denoising"
            ]
            for row in running[:1]:
                if kill_child(row, sc.row):
                    sc.figures.faults += 1
                    kills += 1
            with stack.db.session() as session:
                cut = session.scalar(TERMINATE_APP_BACKENDS) or 0
            sc.figures.faults += cut
            storms += 1
            time.sleep(1.0)
    fig = sc.report(sc.settle(600))
    at_end = memory(stack)
    fig.notes = f"{kills} pool-child kills, {storms} connection storms"
    print(fig.notes)
    print("memory MiB at start:", at_start)
    print("memory MiB at end:  ", at_end)
    assert fig.lost == 0 and fig.duplicate_results == 0 and fig.undelivered == 0, fig.line()
