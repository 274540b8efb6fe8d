"""The denoising pace a worker reports, and the time left a running job is given from it."""

from __future__ import annotations

import threading

import pytest

from app.jobs import queue_info
from app.jobs.queue_info import CostModel
from workers import progress as progress_module
from workers.progress import ProgressReporter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock)
    return clock


def paced(reporter: ProgressReporter, step: int) -> float | None:
    return reporter._pace(step)


def test_the_pace_counts_from_the_first_step_not_from_the_claim(clock):
    reporter = ProgressReporter(lambda _p: True, interval=10.0)
    reporter.begin("loading")
    clock.now += 30.0  # the model loaded for this job, the prompt encoded
    assert paced(reporter, 1) is None  # one step: no pace yet
    clock.now += 0.5
    assert paced(reporter, 2) == pytest.approx(0.5)
    clock.now += 1.5
    assert paced(reporter, 5) == pytest.approx(0.5)
    reporter.close()


def test_a_resumed_run_paces_its_own_steps_only(clock):
    reporter = ProgressReporter(lambda _p: True, interval=10.0)
    assert paced(reporter, 105) is None  # resumed from step 104's checkpoint
    clock.now += 2.0
    assert paced(reporter, 109) == pytest.approx(0.5)
    reporter.close()


def test_the_written_progress_carries_the_pace(clock):
    written: list[dict] = []
    second = threading.Event()

    def write(progress: dict) -> bool:
        written.append(progress)
        if progress["step"] == 2:
            second.set()
        return True

    reporter = ProgressReporter(write, interval=0.0)
    reporter.step(1, 10)
    clock.now += 0.25
    reporter.step(2, 10)
    assert second.wait(10)
    reporter.close()
    assert written[-1]["seconds_per_step"] == pytest.approx(0.25)
    assert all("seconds_per_step" not in p for p in written if p["step"] == 1)


def test_time_left_uses_the_measured_pace_not_the_time_since_the_claim():
    cost = CostModel(fixed=1.0, per_unit=1.0)
    # 34 s since the claim, of which 30 s loading: step 8 of 100 at 0.5 s a step.
    measured = {"stage": "denoising", "step": 8, "total_steps": 100, "seconds_per_step": 0.5}
    assert queue_info.time_left(cost, 100.0, measured, elapsed=34.0) == pytest.approx(46.0)
    # A worker from before the field: its seconds since the claim per step done.
    older = {"stage": "denoising", "step": 8, "total_steps": 100}
    assert queue_info.time_left(cost, 100.0, older, elapsed=34.0) == pytest.approx(391.0)
    # Not denoising yet: the model's estimate less what has passed.
    loading = {"stage": "loading", "step": 0, "total_steps": 100}
    assert queue_info.time_left(cost, 100.0, loading, elapsed=34.0) == pytest.approx(67.0)


def test_the_preemption_pass_weighs_a_long_job_at_its_measured_pace():
    """The relay's preemption pass asks a long job to yield only when enough of it is left
    (DIFFQ_PREEMPT_MIN_LEFT). It weighs that at the pace the worker measured, as the
    queue's ETA does, not at the seconds since the job was first claimed: a job resumed
    from its checkpoint after a wait in the queue counts those seconds too."""
    from datetime import timedelta

    from app.db.models.jobs import Job
    from app.db.types import utcnow
    from app.housekeeping.preemption import seconds_left

    now = utcnow()
    progress = {"stage": "denoising", "step": 60, "total_steps": 100, "seconds_per_step": 0.5}
    resumed = Job(started_at=now - timedelta(seconds=600), progress=progress)
    assert seconds_left(resumed, now) == pytest.approx(20.0)  # not 600 / 60 x 40 = 400
    loading = Job(started_at=now, progress={"stage": "loading", "step": 60, "total_steps": 100})
    assert seconds_left(loading, now) is None
