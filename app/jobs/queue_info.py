"""Where a queued job stands: its position, and an estimate of when it will start.

The estimate fits run time = fixed + per-unit cost (a unit is one step of one image) to
the model's recent successes, charges it for every job ahead and for what the running
jobs have left, and divides by the number of jobs running. It is an estimate, and the
API documents it as one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from app.db.models import Job
from app.db.types import utcnow
from app.jobs import fairness
from app.jobs.states import JobStatus

RECENT_JOBS = 20


@dataclass(frozen=True)
class QueueInfo:
    position: int  # jobs that will be delivered before this one; 0 means next
    eta_seconds: float | None  # None until the model has finished a job


@dataclass(frozen=True)
class CostModel:
    """run seconds ~ fixed + per_unit x work units, fitted to recent successes."""

    fixed: float
    per_unit: float

    def seconds(self, units: int) -> float:
        return self.fixed + self.per_unit * units


def fit(samples: list[tuple[int, float]]) -> CostModel | None:
    """Least squares when the recent jobs differ in size; otherwise a plain ratio."""
    if not samples:
        return None
    units = [u for u, _ in samples]
    if len(set(units)) >= 2:
        mean_u = statistics.fmean(units)
        mean_s = statistics.fmean(s for _, s in samples)
        spread = sum((u - mean_u) ** 2 for u in units)
        slope = sum((u - mean_u) * (s - mean_s) for u, s in samples) / spread
        if slope > 0:
            return CostModel(max(0.0, mean_s - slope * mean_u), slope)
    return CostModel(0.0, statistics.median(s / u for u, s in samples))


def cost_model(session: Session, model: str) -> CostModel | None:
    rows = session.execute(
        select(Job.work_units, Job.started_at, Job.finished_at)
        .where(Job.model == model, Job.status == JobStatus.SUCCEEDED)
        .order_by(Job.finished_at.desc())
        .limit(RECENT_JOBS)
    ).all()
    return fit(
        [
            (units, (finished - started).total_seconds())
            for units, started, finished in rows
            if started and finished
        ]
    )


def _remaining(cost: CostModel, units: int, progress: dict | None, elapsed: float) -> float:
    """A running job's time left: from its own pace once it is denoising, else the model."""
    progress = progress or {}
    step, total = progress.get("step", 0), progress.get("total_steps", 0)
    if progress.get("stage") == "denoising" and 0 < step < total:
        return elapsed * (total - step) / step
    return max(0.0, cost.seconds(units) - elapsed)


def fair_window(settings) -> float | None:
    """The window that fair share compares, or None when fair share is off."""
    return settings.fair_share_window if settings.fair_share else None


def queue_info(session: Session, job: Job, fair_window: float | None = None) -> QueueInfo:
    """With `fair_window` (fair share on), the position follows the tenants' turns."""
    if fair_window is not None:
        position, units_ahead = fairness.position(session, job, utcnow(), fair_window)
    else:
        position, units_ahead = _fifo_position(session, job)
    cost = cost_model(session, job.model)
    if cost is None:
        return QueueInfo(position, None)
    running = session.execute(
        select(Job.started_at, Job.work_units, Job.progress).where(
            Job.queue == job.queue, Job.status == JobStatus.RUNNING
        )
    ).all()
    now = utcnow()
    remaining = sum(
        _remaining(cost, units, progress, (now - started).total_seconds())
        for started, units, progress in running
        if started
    )
    waiting = position * cost.fixed + units_ahead * cost.per_unit
    # Jobs running now are the best count of workers on this queue (at least one).
    workers = max(1, len(running))
    return QueueInfo(position, round((waiting + remaining) / workers, 1))


def _fifo_position(session: Session, job: Job) -> tuple[int, int]:
    ahead = and_(
        Job.queue == job.queue,
        Job.status == JobStatus.QUEUED,
        or_(
            Job.publish_priority > job.publish_priority,
            and_(Job.publish_priority == job.publish_priority, Job.id < job.id),
        ),
    )
    count, units = session.execute(
        select(func.count(), func.coalesce(func.sum(Job.work_units), 0)).where(ahead)
    ).one()
    return int(count), int(units)
