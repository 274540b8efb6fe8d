"""Partitions between machines, simulated: a worker in a network namespace of its own
(testbed/netns.py) reaches the broker, PostgreSQL and S3 over a veth link, which is cut
from one of them mid-job, or slowed and made lossy, under a steady submit rate. A worker
on the host (`fa`) stands for the rest of the fleet. Every accepted job must end once:
nothing lost, no duplicate result, no duplicate webhook.

bench/partitions.py runs the same scenarios longer and more times (the DIFFQ_PARTITION_*
variables below).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.jobs.states import JobStatus
from testbed import netns
from testbed.processes import ManagedProcess, start_worker
from tests.faults.harness import Figures, Scenario, SteadyLoad
from tests.faults.killing import child_pid
from tests.faults.linked import linked_env

pytestmark = [pytest.mark.faults, pytest.mark.services]

WHY_NOT = netns.available()
if WHY_NOT:
    print(f"\npartition scenarios skipped: {WHY_NOT}")
    pytest.skip(f"partition scenarios need network namespaces: {WHY_NOT}", allow_module_level=True)

ROUNDS = int(os.environ.get("DIFFQ_PARTITION_ROUNDS", "1"))
# Over twice the 4 s AMQP heartbeat (both ends give the connection up) and the 10 s lease.
HOLD = float(os.environ.get("DIFFQ_PARTITION_HOLD", "12"))
WINDOW = float(os.environ.get("DIFFQ_PARTITION_WINDOW", "30"))
SUBMIT_PERIOD = float(os.environ.get("DIFFQ_PARTITION_SUBMIT_PERIOD", "1.0"))
HOST_WORKERS = ("fa",)  # the rest of the fleet: one worker on the host
LONG_JOB = {"steps": 400, "width": 128, "height": 128}  # seconds: partitioned mid-job
# A job whose upload follows a moment after it is seen generating. The steady load's
# 16-step jobs can finish within one progress interval on a fast machine (their
# "denoising" is then never written, so never seen); 96 steps take about a second here
# and a third of one on a machine three times as fast: seen either way.
SHORT_JOB = {"steps": 96}
CONNECTION_LOST = r"Connection to broker lost"
CONNECTED = r"Connected to amqp://"


@dataclass
class Remote:
    """The worker on the other side of the link, and how it reaches each service."""

    stack: object
    ns: netns.NetNS
    env: dict[str, str]
    ports: dict[str, int]  # service -> its forwarder's port on the host end
    worker: ManagedProcess | None = None

    def start_worker(self) -> ManagedProcess:
        self.worker = start_worker(
            self.env,
            self.stack.logs,
            "worker-fn",
            models="tiny,tiny-slow,tiny-batch",
            prefix=self.ns.command([]),
        )
        self.stack.workers["fn"] = self.worker
        return self.worker

    def alive(self) -> bool:
        return self.worker is not None and self.worker.process.poll() is None

    def runs(self, row) -> bool:
        """Whether `row` runs on this worker (its pool process is in the namespace)."""
        pid = child_pid(row)
        return pid is not None and self.ns.holds(pid)


def open_remote(stack) -> Remote:
    ns = netns.NetNS().create()
    try:
        env, ports = linked_env(stack, ns)
        remote = Remote(stack, ns, env, ports)
        remote.start_worker()
    except BaseException:
        ns.close()
        raise
    return remote


def close_remote(remote: Remote) -> None:
    try:
        if remote.worker is not None:
            remote.stack.workers.pop("fn", None)
            remote.worker.stop(timeout=60)
    finally:
        remote.ns.close()


def settle_fleet(stack, remote: Remote) -> None:
    """The host worker and the remote one both consume; the link is whole."""
    remote.ns.heal()
    remote.ns.impair()
    stack.stop_workers([name for name in ("fb",) if name in stack.workers])
    stack.ensure_workers(HOST_WORKERS)
    if not remote.alive():
        remote.start_worker()


def wait_for_remote_job(
    sc: Scenario, remote: Remote, long: bool = True, exclude=(), timeout: float = 180.0
):
    """A job of `sc` that the remote worker is generating: a long one, or a short one
    whose upload comes within a second (each submitted until one lands there)."""
    deadline = time.monotonic() + timeout
    probe = LONG_JOB if long else SHORT_JOB
    next_probe = 0.0
    while time.monotonic() < deadline:
        for row in sc.rows().values():
            if (
                row.status == JobStatus.RUNNING
                and (row.progress or {}).get("stage") == "denoising"
                and remote.runs(row)
                and str(row.id) not in exclude
                and (long or row.input.get("steps", 0) < LONG_JOB["steps"])
            ):
                return row
        if time.monotonic() > next_probe:
            kind = "long" if long else "short"
            sc.submit(prompt=f"{sc.figures.scenario.split()[0]}-{kind}", **probe)
            next_probe = time.monotonic() + 4
        time.sleep(0.1)
    raise AssertionError("no job ran on the remote worker")


def _wait_log(worker: ManagedProcess, pattern: str, count: int, timeout: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if worker.count(pattern) >= count:
            return time.monotonic() - started
        time.sleep(0.1)
    return None


def _wait(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


@dataclass
class Outcome:
    fig: Figures
    victims: list[str]
    rows: dict
    dropped: int = 0  # packets the link dropped
    remote_claimed: int = 0  # jobs the remote worker took while the link was impaired


def cut_mid_job(
    stack, remote: Remote, service: str | None, name: str, hold: float, long: bool = True
) -> Outcome:
    """ROUNDS times: wait for a job generating on the remote worker (a long one, or a short
    one about to upload), cut the link to `service` (all of it when None) for `hold`
    seconds, heal; all under steady submits."""
    sc = Scenario(name, stack, stack.new_key())
    worker = remote.worker
    losses = worker.count(CONNECTION_LOST)
    connects = worker.count(CONNECTED)
    victims = []
    dropped_before = remote.ns.dropped()
    with SteadyLoad(sc, SUBMIT_PERIOD, prompt=name.split()[0], steps=16):
        for _ in range(ROUNDS):
            victim = wait_for_remote_job(sc, remote, long=long, exclude=victims)
            victims.append(str(victim.id))
            cut_at = remote.ns.dropped()
            remote.ns.partition(remote.ports[service] if service else None)
            sc.figures.faults += 1
            if not long:
                # The short job's upload may come a few seconds later on a busy machine: the
                # hold counts from the first packet the cut drops (the upload waiting).
                _wait(lambda before=cut_at: remote.ns.dropped() > before, 30)
            time.sleep(hold)
            remote.ns.heal()
            if service in ("broker", None):
                # The worker noticed the silence (missed heartbeats) and reconnects.
                losses += 1
                connects += 1
                assert worker.count(CONNECTION_LOST) >= losses, worker.log()[-3000:]
                back = _wait_log(worker, CONNECTED, connects, 60)
                assert back is not None, "the remote worker never reconnected to the broker"
                sc.figures.recovery_seconds.append(back)
                losses = worker.count(CONNECTION_LOST)
                connects = worker.count(CONNECTED)
            time.sleep(2)
    rows = sc.settle(240)
    fig = sc.report(rows)
    dropped = remote.ns.dropped() - dropped_before
    fig.notes = f"{dropped} packets dropped"
    return Outcome(fig, victims, rows, dropped=dropped)


def impaired_window(stack, remote: Remote, name: str, window: float) -> Outcome:
    """Latency 300 ± 100 ms (on what the remote worker sends) and about 5 % packet loss
    each way on its link for `window` seconds, under steady submits."""
    sc = Scenario(name, stack, stack.new_key())
    dropped = remote.ns.dropped()
    done_before = remote.worker.count(r"job \S+ succeeded in")
    claims_before = remote.worker.count(r"job \S+ claimed \(attempt")
    with SteadyLoad(sc, SUBMIT_PERIOD, prompt=name.split()[0], steps=16):
        remote.ns.impair(delay_ms=300, jitter_ms=100, loss_pct=5)
        sc.figures.faults += 1
        try:
            time.sleep(window)
        finally:
            done_during = remote.worker.count(r"job \S+ succeeded in") - done_before
            claimed = remote.worker.count(r"job \S+ claimed \(attempt") - claims_before
            remote.ns.impair()
    rows = sc.settle(240)
    fig = sc.report(rows)
    dropped = remote.ns.dropped() - dropped
    fig.notes = (
        f"remote worker claimed {claimed} jobs and finished {done_during} in the window; "
        f"{dropped} packets dropped"
    )
    return Outcome(fig, [], rows, dropped=dropped, remote_claimed=claimed)


def assert_once(outcome: Outcome) -> None:
    fig = outcome.fig
    print(fig.notes)
    assert fig.faults >= 1 and outcome.dropped > 0, fig.line()
    assert fig.lost == 0, fig.line()
    assert fig.duplicate_results == 0, fig.line()
    assert fig.duplicate_terminal == 0, fig.line()
    assert fig.duplicate_deliveries == 0 and fig.undelivered == 0, fig.line()
    assert fig.succeeded == fig.submitted - fig.refused, fig.line()
    for victim in outcome.victims:
        assert outcome.rows[victim].status == JobStatus.SUCCEEDED


@pytest.fixture(scope="module")
def remote(fault_stack):
    stack = fault_stack
    stack.stop_workers(["fb"])  # the remote worker takes its place (two CPU cores)
    remote = open_remote(stack)
    try:
        # `ip netns exec` execs in place: the pid ManagedProcess signals is the worker's.
        assert remote.ns.holds(remote.worker.pid)
        assert b"cli" in Path(f"/proc/{remote.worker.pid}/cmdline").read_bytes()
        yield remote
    finally:
        close_remote(remote)  # the suite's other scenarios start `fb` again (quiet_queue)


@pytest.fixture(autouse=True)
def quiet_queue(fault_stack, remote) -> None:
    """Overrides the suite's: the fleet here is `fa` and the remote worker; idle to start."""
    from sqlalchemy import func, select

    from app.db.models.jobs import Job

    settle_fleet(fault_stack, remote)
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


def test_n1_worker_cut_from_the_broker_mid_job(fault_stack, remote):
    """Longer than three heartbeats: both ends drop the connection, the broker requeues
    the unacked message, the job runs on (its pool process keeps the model), records its
    outcome in PostgreSQL, and the redelivery finds it finished."""
    outcome = cut_mid_job(fault_stack, remote, "broker", f"N1 cut from broker {HOLD:g} s", HOLD)
    assert_once(outcome)
    assert all(r >= 0 for r in outcome.fig.recovery_seconds)


def test_n2_worker_cut_from_postgres_mid_job(fault_stack, remote):
    """Longer than the lease (10 s): the reaper requeues the job, the host worker runs it;
    the remote run, back, must not record a second outcome."""
    outcome = cut_mid_job(
        fault_stack, remote, "postgres", f"N2 cut from PostgreSQL {HOLD:g} s", HOLD
    )
    assert_once(outcome)


def test_n3_worker_cut_from_s3_mid_job(fault_stack, remote):
    """A short job cut from S3 just before its upload, for less than the uploads' retries
    last: the upload waits for the link and succeeds."""
    outcome = cut_mid_job(fault_stack, remote, "s3", "N3 cut from S3 6 s", 6, long=False)
    assert_once(outcome)


def test_n4_latency_and_loss_on_the_worker_link(fault_stack, remote):
    outcome = impaired_window(fault_stack, remote, f"N4 300±100 ms, 5 % loss, {WINDOW:g} s", WINDOW)
    assert_once(outcome)
    # It kept taking work over the slow link (how much it finished is printed: a few).
    assert outcome.remote_claimed >= 1, "the remote worker took no job over the slow link"
