"""The demand forecast read from the jobs' history (app/jobs/forecast.py), on PostgreSQL
and on the embedded SQLite: the minutes are read from the jobs' time-ordered ids, and a
burst seen a week ago is forecast before it comes back."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from app.db.models.jobs import Job
from app.db.types import utcnow
from app.ids import uuid7
from app.jobs.forecast import WEEK, forecast_gpus
from app.jobs.states import JobStatus

pytestmark = pytest.mark.services


def _jobs(session, tenant_id, queue: str, minute: int, count: int, **fields) -> None:
    """`count` jobs created in epoch `minute` (their ids say so, as app/ids.py makes them)."""
    for i in range(count):
        session.add(
            Job(
                id=uuid7(now_ms=minute * 60_000 + i * 100),
                tenant_id=tenant_id,
                model=queue,
                queue=queue,
                input={"prompt": "p"},
                **fields,
            )
        )


def test_a_burst_seen_last_week_is_forecast_in_gpus(database):
    from app.keys import get_or_create_tenant

    run = uuid.uuid4().hex[:8]
    bursty, quiet, fresh = f"gpu.burst-{run}", f"gpu.quiet-{run}", f"gpu.fresh-{run}"
    now = utcnow()
    minute = int(now.timestamp() // 60)
    done = {"status": JobStatus.SUCCEEDED, "gpu_seconds": 30.0}
    with database.session() as session:
        tenant = get_or_create_tenant(session, f"forecast-{run}")
        for queue in (bursty, quiet):
            # Eight days of history, and the jobs' GPU-seconds: 30 each.
            _jobs(
                session,
                tenant.id,
                queue,
                minute - 8 * 24 * 60,
                1,
                **done,
                finished_at=now - timedelta(days=8),
            )
            _jobs(session, tenant.id, queue, minute - 60, 3, **done, finished_at=now)
        # A week ago, starting 4 minutes from now's minute of the week: 10 jobs a minute
        # for 5 minutes; the quiet queue had 10 jobs then, 30 minutes later.
        for m in range(minute - WEEK + 4, minute - WEEK + 9):
            _jobs(session, tenant.id, bursty, m, 10)
        _jobs(session, tenant.id, quiet, minute - WEEK + 30, 10)
        # A queue that has never finished a job: nothing to forecast with.
        _jobs(session, tenant.id, fresh, minute - 1, 5)
    gpus = forecast_gpus(database, [bursty, quiet, fresh])
    print(f"forecast GPUs: {gpus}")
    # 10 jobs a minute x 30 GPU-seconds a job / 60 s = 5 GPUs busy.
    assert gpus[bursty] == pytest.approx(5.0)
    assert gpus[quiet] == 0.0  # its busy minutes are past the lookahead
    assert fresh not in gpus


def test_the_collector_exports_a_forecast_for_every_queue(database):
    from app.gauges.readings import ServiceCollector

    queues = [f"gpu.none-{uuid.uuid4().hex[:8]}"]
    families = {f.name: f for f in ServiceCollector(database, queues, None).collect()}
    samples = families["diffq_demand_forecast_gpus"].samples
    assert [(s.labels["queue"], s.value) for s in samples] == [(queues[0], 0.0)]


def test_a_forecast_that_cannot_be_read_leaves_the_other_readings(database, monkeypatch):
    from app.gauges import readings

    def broken(*_args, **_kwargs):
        raise RuntimeError("no forecast")

    monkeypatch.setattr(readings, "forecast_gpus", broken)
    queues = [f"gpu.broken-{uuid.uuid4().hex[:8]}"]
    names = {f.name for f in readings.ServiceCollector(database, queues, None).collect()}
    assert "diffq_queue_depth" in names and "diffq_queue_backlog_gpu_seconds" in names
    assert "diffq_demand_forecast_gpus" not in names
