"""Cheap faults in numbers, and crashes rather than clean stops: the database's
connections cut from under the service, and the broker killed with -9."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from app.jobs.states import JobStatus
from testbed.services import broker_connection
from testbed.waiting import wait_until
from tests.faults.harness import FLOORS, Scenario
from tests.faults.test_service_faults import SteadyLoad, _first_start_after

pytestmark = [pytest.mark.faults, pytest.mark.services]

TERMINATE_APP_BACKENDS = text(
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND backend_type = 'client backend'"
)


def _ready(stack, queue: str = "gpu.tiny") -> int:
    with broker_connection(stack.env["DIFFQ_BROKER_URL"]) as conn:
        return conn.default_channel.queue_declare(queue, passive=True).message_count


def test_f14_database_connections_terminated_in_storms(fault_stack):
    """`pg_terminate_backend` on every connection the API, relay and workers hold, again
    and again under steady submits; each terminated connection is one fault."""
    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario("F14 pg_terminate_backend storms", stack, stack.new_key())
    storms = 0
    with SteadyLoad(sc, 0.25, prompt="f14", steps=8):
        deadline = time.monotonic() + 90
        while (storms < 22 or sc.figures.faults < FLOORS["F14"]) and time.monotonic() < deadline:
            time.sleep(0.5)
            with stack.db.session() as session:
                sc.figures.faults += session.scalar(TERMINATE_APP_BACKENDS) or 0
            storms += 1
    fig = sc.report(sc.settle(180))
    fig.notes = f"{storms} storms, {fig.faults} connections terminated, {fig.refused} POSTs refused"
    print(fig.notes)
    assert fig.faults >= FLOORS["F14"], "the storms found too few connections to cut"
    assert fig.lost == 0 and fig.duplicate_results == 0 and fig.undelivered == 0, fig.line()
    assert fig.succeeded == len(sc.accepted), fig.line()


def test_f15_broker_killed_with_ready_messages_and_no_safety_net(fault_stack):
    """kill -9 with messages waiting and nothing that could publish them again (relay and
    reaper off, workers stopped): every one is still there after the restart, and runs."""
    stack = fault_stack
    stack.stop_relay()
    stack.stop_workers()
    sc = Scenario("F15 broker kill -9, relay+reaper off", stack, stack.new_key())
    try:
        before = _ready(stack)
        for i in range(12):
            sc.submit(prompt=f"f15-{i}", steps=4)
        # Confirms are recorded in batches, a few milliseconds after the 202.
        wait_until(
            lambda: all(row.published_at is not None for row in sc.rows().values()), timeout=5
        )
        assert _ready(stack) == before + len(sc.accepted)
        stack.rabbit.kill()
        sc.figures.faults += 1
        stack.rabbit.start()
        survived = _ready(stack)
        print(f"\nready before the kill: {before + len(sc.accepted)}, after restart: {survived}")
        assert survived == before + len(sc.accepted)
        stack.ensure_workers()
        rows = sc.settle(180)  # with the relay still off: nothing was published again
        stack.start_relay()  # now, for the webhooks the harness counts
        fig = sc.report(rows)
    finally:
        stack.ensure_workers()
        if stack.relay is None:
            stack.start_relay()
    assert fig.lost == 0 and fig.duplicate_results == 0 and fig.undelivered == 0, fig.line()
    assert fig.succeeded == len(sc.accepted) == 12, fig.line()


def test_f16_broker_killed_under_steady_submits(fault_stack):
    """kill -9 with everything on: POST keeps answering 202; the first job after the
    restart starts within seconds (printed; the goal is 5 s)."""
    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario("F16 broker kill -9 under load", stack, stack.new_key())
    with SteadyLoad(sc, 1.0, prompt="f16", steps=8) as load:
        time.sleep(3)
        stack.rabbit.kill()
        sc.figures.faults += 1
        time.sleep(2)
        stack.rabbit.start()
        back = datetime.now(UTC)
        recovery = None
        deadline = time.monotonic() + 60
        while recovery is None and time.monotonic() < deadline:
            recovery = _first_start_after(sc, back)
            time.sleep(0.2)
        sc.figures.recovery_seconds.append(recovery if recovery is not None else -1)
        time.sleep(3)
    fig = sc.report(sc.settle(180))
    fig.notes = f"first job after the restart {recovery}s; slowest POST {max(load.latencies):.2f}s"
    print(fig.notes)
    assert fig.refused == 0, "every POST during the outage must answer 202"
    assert fig.lost == 0 and fig.duplicate_results == 0 and fig.undelivered == 0, fig.line()
    assert fig.succeeded == len(sc.accepted)
    assert recovery is not None
    rows = sc.rows()
    assert all(row.status == JobStatus.SUCCEEDED for row in rows.values())
