"""N7: a worker's wall clock jumps mid-job (an NTP step, a VM resumed from a snapshot),
under a steady submit rate. The worker runs with libfaketime preloaded, its offset read
from a file the test rewrites; its monotonic clock is left alone, as a real step leaves it.

Leases are written and compared on the database's clock (app/db/clock.py), so:
- a jump back must not make the running job's lease look expired, which would let the
  reaper hand it back to the queue while it still runs (a second generation, and a
  second attempt);
- a jump forward must not make a hung job's lease last as long as the jump: the reaper
  takes it back within the lease (10 s here), not at the hard time limit or later.

The jumps are 5 minutes, thirty leases: an NTP step of that size happens; a larger one
also puts the worker outside S3's 15-minute window for signed requests, and its uploads
are refused whatever the leases do (docs/reliability.md).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import time
from pathlib import Path

import pytest

from app.jobs.states import JobStatus
from tests.faults.harness import Scenario, SteadyLoad, describe_claims
from tests.faults.killing import child_pid, parent_pid

pytestmark = [pytest.mark.faults, pytest.mark.services]

# Long jobs are of `tiny-long`, whose queue only the jumpy worker consumes: each runs there
# at once. (Of the shared queue, each landed on `fa` half the time, a minute of its cores
# under load, and the next waited behind the steady load's backlog: under load, no long
# job reached the jumpy worker within 180 s.)
LONG_JOB = {"model": "tiny-long", "steps": 400, "width": 128, "height": 128}  # tens of s
# The job frozen by the jump forward need only be running 2 s after its first step: it is
# run again from its start once taken back, so a shorter one keeps that rerun well inside
# its time limit on a slow machine (a 400-step rerun once ran past 300 s under CI's load).
HUNG_JOB = {**LONG_JOB, "steps": 150}
NAME = "fj"  # the worker whose clock jumps; `fa` on the host is the rest of the fleet
MODELS = "tiny,tiny-long"  # the jumpy worker's: the shared queue, and the long jobs'
# A short job every 2 s: within what the two workers serve beside the long job on a
# loaded machine (at one a second the backlog grew for the whole scenario).
STEADY_PERIOD = 2.0


def _faketime_library() -> Path | None:
    spec = importlib.util.find_spec("libfaketime")
    if spec is None or spec.origin is None:
        return None
    found = Path(spec.origin).parent / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"
    return found if found.exists() else None


LIBRARY = _faketime_library()
if LIBRARY is None:
    print("\nclock-jump scenarios skipped: libfaketime (the test extra) is not installed")
    pytest.skip("the clock-jump scenarios need libfaketime's library", allow_module_level=True)


class Jumpy:
    """A worker whose wall clock is the real one plus the offset in `clock_file`."""

    def __init__(self, stack, clock_file: Path) -> None:
        self.stack = stack
        self.clock_file = clock_file
        self.set_offset("+0")
        self.worker = stack.start_worker(
            NAME,
            {
                "LD_PRELOAD": str(LIBRARY),
                "FAKETIME_TIMESTAMP_FILE": str(clock_file),
                "FAKETIME_CACHE_DURATION": "1",  # the file is read again every second
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            },
            models=MODELS,
        )

    def set_offset(self, offset: str) -> None:
        self.clock_file.write_text(f"{offset}\n")
        time.sleep(1.5)  # past the library's cache

    def runs(self, row) -> bool:
        """Whether `row`'s pool process descends from this worker's process."""
        pid = child_pid(row)
        for _ in range(4):
            if pid is None or pid <= 1:
                return False
            if pid == self.worker.pid:
                return True
            pid = parent_pid(pid)
        return False


@pytest.fixture(scope="module")
def jumpy(fault_stack, tmp_path_factory):
    fault_stack.stop_workers(["fb"])  # the jumpy worker takes its place (two CPU cores)
    jumpy = Jumpy(fault_stack, tmp_path_factory.mktemp("clock") / "faketime")
    try:
        yield jumpy
    finally:
        fault_stack.stop_workers([NAME])  # the suite's quiet_queue starts `fb` again


@pytest.fixture(autouse=True)
def quiet_queue(fault_stack, jumpy) -> None:
    """Overrides the suite's: the fleet here is `fa` and the jumpy worker; idle to start."""
    from sqlalchemy import func, select

    from app.db.models.jobs import Job

    jumpy.set_offset("+0")
    fault_stack.stop_workers(["fb"])
    fault_stack.ensure_workers(("fa",))
    if jumpy.worker.process.poll() is not None:
        jumpy.worker = fault_stack.start_worker(NAME, jumpy.worker.env, MODELS)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        with fault_stack.db.session() as session:
            busy = session.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))
            )
        if not busy:
            return
        time.sleep(0.5)
    pytest.fail(f"{busy} jobs still queued or running from an earlier scenario")


def long_job_on(sc: Scenario, jumpy: Jumpy, job: dict = LONG_JOB, timeout: float = 180.0):
    """A long job generating on the jumpy worker (the only one that consumes its queue; it
    starts once the worker's current short job ends)."""
    job_id = sc.submit(prompt=f"{sc.figures.scenario.split()[0]}-long", **job)
    assert job_id is not None, "the long job was refused"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = sc.row(job_id)
        if row.status.terminal:
            raise AssertionError(f"the long job ended before it was seen running: {row.status}")
        if (row.progress or {}).get("stage") == "denoising" and jumpy.runs(row):
            return row
        time.sleep(0.1)
    raise AssertionError(f"the long job did not start on the jumpy worker in {timeout:.0f} s")


def assert_once(fig, takeovers: int = 0, sc: Scenario | None = None, victim=None) -> None:
    """Every job ended once; `takeovers`: the claims after a hang, the only extra ones."""
    assert fig.lost == 0, fig.line()
    assert fig.duplicate_results == 0, fig.line()
    if sc is not None and fig.duplicate_generations != takeovers:
        logs = "".join(p.read_text(errors="replace") for p in sc.stack.worker_logs())
        print(describe_claims(sc.accepted, logs, but=(str(victim),)))
    assert fig.duplicate_generations == takeovers, fig.line()
    assert fig.duplicate_terminal == 0, fig.line()
    assert fig.duplicate_deliveries == 0 and fig.undelivered == 0, fig.line()
    assert fig.succeeded == fig.submitted - fig.refused, fig.line()


def test_n7_a_jump_back_does_not_hand_a_running_job_to_another_worker(fault_stack, jumpy):
    sc = Scenario("N7 clock jump back 5 min mid-job", fault_stack, fault_stack.new_key())
    with SteadyLoad(sc, STEADY_PERIOD, prompt="N7", steps=16):
        victim = long_job_on(sc, jumpy)
        jumpy.set_offset("-5m")
        sc.figures.faults += 1
        # Its lease is renewed on the jumped clock for the rest of the job.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not sc.row(str(victim.id)).status.terminal:
            time.sleep(0.5)
    rows = sc.settle(240)
    fig = sc.report(rows)
    ended = rows[str(victim.id)]
    print(f"N7 back: victim {victim.id} {ended.status.value} after {ended.attempts} attempt(s)")
    assert ended.status == JobStatus.SUCCEEDED and ended.attempts == 1, fig.line()
    assert_once(fig, sc=sc, victim=victim.id)


def test_n7_a_jump_forward_does_not_stretch_a_hung_jobs_lease(fault_stack, jumpy):
    """The pool process running the job is frozen (a hung kernel call, say) while its
    worker's main process stays connected to the broker, so no redelivery comes: only the
    lease can free the job. It was last renewed with the clock 5 minutes ahead."""
    sc = Scenario("N7 clock jump forward 5 min + hung job", fault_stack, fault_stack.new_key())
    with SteadyLoad(sc, STEADY_PERIOD, prompt="N7", steps=16):
        jumpy.set_offset("+5m")
        victim = long_job_on(sc, jumpy, HUNG_JOB)
        time.sleep(2)  # renewed at least once on the jumped clock
        owner = sc.row(str(victim.id)).lease_owner
        pid = child_pid(sc.row(str(victim.id)))
        assert pid is not None and jumpy.runs(sc.row(str(victim.id)))
        os.kill(pid, signal.SIGSTOP)
        sc.figures.faults += 1
        frozen_at = time.monotonic()
        try:
            taken_back = None
            while time.monotonic() - frozen_at < 80:  # well under the 330 s hard time limit
                row = sc.row(str(victim.id))
                if row.lease_owner != owner:
                    taken_back = time.monotonic() - frozen_at
                    break
                time.sleep(0.25)
        finally:
            os.kill(pid, signal.SIGKILL)  # the hung process goes; its worker replaces it
        assert taken_back is not None, "the hung job's lease did not lapse within 80 s"
        sc.figures.recovery_seconds.append(taken_back)
    rows = sc.settle(240)
    fig = sc.report(rows)
    print(f"N7 forward: the hung job was taken back {taken_back:.1f} s after it froze")
    # The lease is 10 s and the reaper passes every 0.5 s: well inside 30 s.
    assert taken_back < 30, fig.line()
    ended = rows[str(victim.id)]
    said = f"{fig.line()}; the hung job {ended.status.value} ({ended.error_message})"
    assert ended.status == JobStatus.SUCCEEDED, said
    # The frozen run never finished (no duplicate result). Its job was claimed once more,
    # by the pool process that replaced the frozen one, and only then: the frozen one has its
    # message redelivered, which is stale by then (the job was handed back since) and
    # takes over no run (workers/claim.py). No other job was claimed twice.
    logs = "".join(p.read_text(errors="replace") for p in fault_stack.worker_logs())
    claims = len(re.findall(rf"job {victim.id} claimed \(attempt", logs))
    print(f"N7 forward: the hung job was claimed {claims} times")
    assert claims == 2, claims
    assert_once(fig, takeovers=1, sc=sc, victim=victim.id)
