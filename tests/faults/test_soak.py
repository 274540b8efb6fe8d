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

STEPS = 40  # long enough that a loop often finds a job mid-denoising to kill


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


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _services(stack) -> dict[str, object]:
    named = {"api": stack.api, "relay": stack.relay, "webhooks": stack.deliverer}
    named.update({f"worker-{n}": w for n, w in stack.workers.items()})
    return {name: proc for name, proc in named.items() if proc is not None}


def sample(stack) -> dict[str, float]:
    """One reading of what could leak: each service tree's resident memory (MiB) and open
    file descriptors, PostgreSQL's client connections, RabbitMQ's connections and channels."""
    from sqlalchemy import text

    reading: dict[str, float] = {}
    for name, proc in _services(stack).items():
        tree = _tree(proc.pid)
        reading[f"{name} MiB"] = round(sum(_rss_mib(p) for p in tree), 1)
        reading[f"{name} fds"] = sum(_fds(p) for p in tree)
    with stack.db.session() as session:
        reading["postgres connections"] = session.scalar(
            text("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
        )
    for what in ("connections", "channels"):
        listed = stack.rabbit._ctl(f"list_{what}", "--quiet", "--no-table-headers", "pid")
        reading[f"rabbitmq {what}"] = len([line for line in listed.stdout.splitlines() if line])
    return reading


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def drift(samples: list[dict[str, float]]) -> dict[str, tuple[float, float, float]]:
    """Per reading, the first quarter being warm-up: the median of the second quarter, of
    the last quarter, and their ratio (a leak grows it; a count that swings does not)."""
    quarter = max(1, len(samples) // 4)
    early, late = samples[quarter : 2 * quarter], samples[-quarter:]
    out = {}
    for key in samples[-1]:
        before = _median([s.get(key, 0) for s in early]) or 1
        after = _median([s.get(key, 0) for s in late])
        out[key] = (before, after, after / before)
    return out


def test_soak_the_fault_mix(fault_stack):
    target = int(os.environ.get("DIFFQ_SOAK_FAULTS", "0"))
    if target <= 0:
        pytest.skip("soak run only: set DIFFQ_SOAK_FAULTS (bench/soak.py does)")
    period = float(os.environ.get("DIFFQ_SOAK_SUBMIT_PERIOD", "0.5"))
    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario(f"soak: {target} faults", stack, stack.new_key())
    at_start = memory(stack)
    samples = [sample(stack)]
    kills = storms = 0
    killed: set[str] = set()
    next_sample = time.monotonic() + 10
    with SteadyLoad(sc, period, prompt="soak", steps=STEPS):
        while sc.figures.faults < target:
            if time.monotonic() > next_sample:
                samples.append(sample(stack))
                next_sample = time.monotonic() + 10
            # Each job killed at most once: three kills of one job spend its attempts
            # (DIFFQ_MAX_ATTEMPTS) and dead-letter it, by design, not by a fault's effect.
            running = [
                row
                for row in sc.rows().values()
                if row.status == JobStatus.RUNNING
                and (row.progress or {}).get("stage") == "denoising"
                and str(row.id) not in killed
            ]
            for row in running[:1]:
                if kill_child(row, sc.row):
                    killed.add(str(row.id))
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
    samples.append(sample(stack))
    table = drift(samples)
    print(f"{len(samples)} samples, 10 s apart; medians after warm-up (the first quarter):")
    print(f"{'reading':<28} {'2nd quarter':>11} {'last quarter':>12} {'ratio':>6}")
    for key, (before, after, ratio) in table.items():
        print(f"{key:<28} {before:>11.1f} {after:>12.1f} {ratio:>6.2f}")
    assert fig.lost == 0 and fig.duplicate_results == 0 and fig.undelivered == 0, fig.line()
    # Nothing grows with the faults: memory and descriptors flat within 10 % once warm.
    assert len(samples) >= 8, "too short a soak to tell a trend (under 80 s)"
    # Descriptors count in units that come and go with the pools' connections (a worker
    # holds 30 to 40): a move of up to 4 is not a trend.
    grown = {
        key: round(ratio, 2)
        for key, (before, after, ratio) in table.items()
        if (key.endswith("MiB") or key.endswith("fds"))
        and not 0.9 <= ratio <= 1.1
        and not (key.endswith("fds") and abs(after - before) <= 4)
    }
    assert not grown, f"readings that moved over 10 % after warm-up: {grown}"
