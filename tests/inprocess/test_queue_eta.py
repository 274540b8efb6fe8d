"""The queue's ETA charges each job ahead for its size, not only its steps (SQLite rows
made by hand; app/jobs/queue_info.py)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import pytest

from app.catalog import tiny_spec
from app.db.models.jobs import Job
from app.db.types import utcnow
from app.jobs.queue_info import cost_model, fit, queue_info, work
from app.jobs.states import JobStatus
from testbed import factories


@pytest.fixture
def db(tmp_path):
    database = factories.database(factories.settings_for(tmp_path))
    yield database
    database.dispose()


@pytest.fixture
def spec(tmp_path):
    # One model per test, on a queue of its own.
    name = f"m{uuid.uuid4().hex[:6]}"
    return replace(tiny_spec(tmp_path / "tiny"), name=name, queue=f"gpu.{name}")


def _job(db, tenant, spec, status, *, seconds_ago=0.0, run_seconds=None, **params):
    job_id = factories.queued_job(db, tenant, spec, **params)
    with db.session() as session:
        job = session.get(Job, job_id)
        if status != JobStatus.QUEUED:
            job.status = status
            job.started_at = utcnow() - timedelta(seconds=seconds_ago)
            job.progress = {"stage": "loading", "step": 0, "total_steps": params.get("steps", 4)}
        if run_seconds is not None:
            job.finished_at = job.started_at + timedelta(seconds=run_seconds)
        session.commit()
    return job_id


def _eta(db, job_id) -> float | None:
    with db.session() as session:
        return queue_info(session, session.get(Job, job_id)).eta_seconds


def units(**params) -> float:
    """The work of a request of these fields, as the queue's ETA reads it from a row."""
    return work(factories.job_request(**params).stored())


def test_work_grows_with_steps_images_and_pixels():
    assert units(width=512, height=512, steps=1, num_images=1) == 1.0
    assert units(width=1024, height=1024, steps=30, num_images=2) == 240.0
    assert units(width=64, height=64, steps=4, num_images=1) == 4 / 64


def test_one_small_job_does_not_make_a_large_one_look_small(db, spec):
    """The case met after a first start: one 64 x 64 job finished in 0.3 s; a 256 x 192
    job of 40 steps runs now. The job behind it used to be told 'about 3 s'."""
    tenant = factories.tenant(db)
    _job(db, tenant, spec, JobStatus.SUCCEEDED, run_seconds=0.3, width=64, height=64, steps=4)
    running = dict(width=256, height=192, steps=40)
    _job(db, tenant, spec, JobStatus.RUNNING, **running)
    behind = _job(db, tenant, spec, JobStatus.QUEUED, width=64, height=64, steps=4)

    eta = _eta(db, behind)
    per_unit = 0.3 / units(width=64, height=64, steps=4)
    expected = per_unit * units(**running)
    print(f"\nETA behind a 256x192x40 job, from one 64x64x4 job of 0.3 s: {eta} s")
    assert eta == pytest.approx(expected, rel=0.05)  # 36 s, where steps alone said 3 s


def test_jobs_ahead_are_charged_for_their_size(db, spec):
    tenant = factories.tenant(db)
    # Two sizes finished: the fit separates the fixed cost from the cost per unit.
    _job(db, tenant, spec, JobStatus.SUCCEEDED, run_seconds=1.0, width=64, height=64, steps=8)
    _job(db, tenant, spec, JobStatus.SUCCEEDED, run_seconds=4.0, width=256, height=192, steps=8)
    small_queue = [_job(db, tenant, spec, JobStatus.QUEUED, width=64, height=64, steps=8)]
    small_queue.append(_job(db, tenant, spec, JobStatus.QUEUED, width=64, height=64, steps=8))
    eta_small = _eta(db, small_queue[-1])

    other = replace(spec, name=spec.name + "x", queue=spec.queue + "x")
    _job(db, tenant, other, JobStatus.SUCCEEDED, run_seconds=1.0, width=64, height=64, steps=8)
    _job(db, tenant, other, JobStatus.SUCCEEDED, run_seconds=4.0, width=256, height=192, steps=8)
    large_queue = [_job(db, tenant, other, JobStatus.QUEUED, width=256, height=192, steps=8)]
    large_queue.append(_job(db, tenant, other, JobStatus.QUEUED, width=256, height=192, steps=8))
    eta_large = _eta(db, large_queue[-1])
    print(f"\none 64x64 job ahead: {eta_small} s; one 256x192 job ahead: {eta_large} s")
    assert eta_small == pytest.approx(1.0, rel=0.1)
    assert eta_large == pytest.approx(4.0, rel=0.1)


def test_the_fit_reads_sizes_from_the_inputs(db, spec):
    tenant = factories.tenant(db)
    _job(db, tenant, spec, JobStatus.SUCCEEDED, run_seconds=2.0, width=128, height=128, steps=8)
    with db.session() as session:
        cost = cost_model(session, spec.name)
    assert cost == fit([(units(width=128, height=128, steps=8), 2.0)])
    assert cost.seconds(units(width=256, height=256, steps=8)) == pytest.approx(8.0)


@pytest.mark.parametrize("speed", [3.0, 1 / 3])
def test_the_jobs_behind_a_running_one_are_charged_at_its_pace_now(db, spec, speed):
    """The recent runs were made on a machine `speed` times slower than the running job's
    measured pace says it is now: the jobs behind it are charged at the pace now (run
    73's flake: an estimate three times the wait, fitted to runs made under load)."""
    tenant = factories.tenant(db)
    size = dict(width=128, height=128, steps=20)
    # History: 4 steps in 6 s, 20 in 10 s: 5 s fixed and 0.25 s a step.
    _job(db, tenant, spec, JobStatus.SUCCEEDED, run_seconds=6.0, width=128, height=128, steps=4)
    _job(db, tenant, spec, JobStatus.SUCCEEDED, run_seconds=10.0, **size)
    running = _job(db, tenant, spec, JobStatus.RUNNING, seconds_ago=2.0, **size)
    pace = 0.25 / speed  # its measured seconds per step
    with db.session() as session:
        job = session.get(Job, running)
        job.progress = {"stage": "denoising", "step": 10, "total_steps": 20}
        job.progress = {**job.progress, "seconds_per_step": pace}
        session.commit()
    first = _job(db, tenant, spec, JobStatus.QUEUED, **size)
    second = _job(db, tenant, spec, JobStatus.QUEUED, **size)
    ahead, behind = _eta(db, first), _eta(db, second)
    print(f"\nx{speed:.2f} the history's speed: {ahead} s, then {behind} s")
    assert ahead == pytest.approx(10 * pace, abs=0.06)  # the running job's 10 steps left
    assert behind - ahead == pytest.approx(10.0 / speed, abs=0.11)  # one job at the pace now
