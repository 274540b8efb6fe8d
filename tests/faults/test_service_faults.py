"""The broker, the database and the store go away under load, and come back."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from app.jobs.states import JobStatus
from tests.faults.harness import Scenario, SteadyLoad

pytestmark = [pytest.mark.faults, pytest.mark.services]


def _first_start_after(sc: Scenario, moment: datetime) -> float | None:
    from app.db.models.jobs import Job

    # Only the scenario's own jobs: a worker of an earlier scenario whose clock ran ahead
    # (N7) leaves rows started "in the future".
    ids = [uuid.UUID(job_id) for job_id in sc.accepted]
    with sc.stack.db.session() as session:
        first = session.scalar(
            select(func.min(Job.started_at)).where(Job.id.in_(ids), Job.started_at > moment)
        )
    return (first - moment).total_seconds() if first else None


def _model_loads(stack) -> int:
    return sum(worker.count(r"model \S+ loaded on") for worker in stack.workers.values())


def _running(sc: Scenario) -> int:
    return sum(row.status == JobStatus.RUNNING for row in sc.rows().values())


def test_f4_broker_stopped_and_restarted_under_steady_submits(fault_stack):
    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario("F4 broker stopped + restarted", stack, stack.new_key())
    loads_before = _model_loads(stack)
    running_at_outage = []
    with SteadyLoad(sc, 0.5, prompt="f4", steps=16) as load:
        for outage in (stack.rabbit.stop,):
            time.sleep(3)
            # A job that is surely running when the broker goes (the load's are short).
            sc.submit(prompt="f4-long", steps=300, width=128, height=128)
            deadline = time.monotonic() + 30
            while not _running(sc) and time.monotonic() < deadline:
                time.sleep(0.1)
            running_at_outage.append(_running(sc))
            outage()
            sc.figures.faults += 1
            time.sleep(2)
            stack.rabbit.start()
            back = datetime.now(UTC)
            time.sleep(4)
            recovery = None
            deadline = time.monotonic() + 60
            while recovery is None and time.monotonic() < deadline:
                recovery = _first_start_after(sc, back)
                time.sleep(0.2)
            sc.figures.recovery_seconds.append(recovery if recovery is not None else -1)
        time.sleep(3)
    fig = sc.report(sc.settle(180))
    reloads = _model_loads(stack) - loads_before
    fig.notes = (
        f"slowest POST {max(load.latencies):.2f}s; jobs running at the outage "
        f"{running_at_outage}; model reloads {reloads}"
    )
    print(fig.notes)
    # A blip must not kill the pool process that holds the model (and the running job).
    assert all(running_at_outage), "no job was running when the broker went away"
    assert reloads == 0
    assert fig.refused == 0, "every POST during the outages must answer 202"
    assert fig.lost == 0 and fig.duplicate_results == 0 and fig.undelivered == 0, fig.line()
    assert fig.succeeded == len(sc.accepted)
    assert all(r >= 0 for r in fig.recovery_seconds)


def test_f8_postgres_restarted_under_load(fault_stack):
    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario("F8 PostgreSQL restart x10", stack, stack.new_key())
    restarts: list[datetime] = []
    with SteadyLoad(sc, 0.5, prompt="f8", steps=16):
        for _ in range(10):
            time.sleep(2)
            stack.pg.restart("fast")
            restarts.append(datetime.now(UTC))
            sc.figures.faults += 1
        time.sleep(2)
    rows = sc.settle(180)
    for back in restarts:  # database back -> the next job started
        recovery = _first_start_after(sc, back)
        sc.figures.recovery_seconds.append(recovery if recovery is not None else -1)
    fig = sc.report(rows)
    assert fig.lost == 0 and fig.duplicate_results == 0 and fig.undelivered == 0, fig.line()
    assert fig.succeeded == len(sc.accepted)
    assert all(r >= 0 for r in fig.recovery_seconds)


def test_f9_s3_unavailable_for_a_while(fault_stack):
    stack = fault_stack
    stack.ensure_workers()
    from app.storage.retry import outage_budget

    # The workers retry 6 times from 0.5 s up to 4 s: a guaranteed span of 7.75 s.
    budget = outage_budget(6, 0.5, 4.0)
    outage = budget - 1.5
    sc = Scenario(f"F9 S3 down for {outage:.1f} s", stack, stack.new_key())
    refused_before = stack.proxy.refused
    for i in range(6):
        sc.submit(prompt=f"f9-before-{i}", steps=16)
    time.sleep(1)
    stack.proxy.down()
    outage_started = time.monotonic()
    while time.monotonic() - outage_started < outage - 0.5:
        sc.submit(prompt="f9-during", steps=4)
        time.sleep(0.4)
    time.sleep(max(0.0, outage - (time.monotonic() - outage_started)))
    stack.proxy.up()
    back = datetime.now(UTC)
    rows = sc.settle(120)
    sc.figures.faults = stack.proxy.refused - refused_before
    recovery = _first_finish_after(sc, back)
    sc.figures.recovery_seconds.append(recovery if recovery is not None else -1)
    fig = sc.report(rows)
    assert fig.faults > 0, "no upload met the outage"
    assert fig.lost == 0 and fig.duplicate_results == 0 and fig.undelivered == 0, fig.line()
    # The outage is shorter than the retries' guaranteed span: nothing had to fail.
    assert fig.succeeded == len(sc.accepted), fig.line()
    assert all(row.status == JobStatus.SUCCEEDED for row in rows.values())


def _first_finish_after(sc: Scenario, moment: datetime) -> float | None:
    from app.db.models.jobs import Job

    with sc.stack.db.session() as session:
        first = session.scalar(select(func.min(Job.finished_at)).where(Job.finished_at > moment))
    return (first - moment).total_seconds() if first else None
