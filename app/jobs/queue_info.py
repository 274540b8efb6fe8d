"""Where a queued job stands: its position, and an estimate of when it will start.

The estimate fits run time = fixed + per-unit cost to the model's recent successes,
charges it for every job ahead and for what the running jobs have left, and divides by
the number of jobs running. A unit is one denoising step of one 512 x 512 image: work
grows with steps x images x pixels (a VAE that downsamples by 8, as every Stable
Diffusion VAE does, makes the latents, and so each step, scale with the pixels). With
steps alone, one finished 64 x 64 job made a 512 x 512 one look 64 times cheaper than it
was. It is an estimate, and the API documents it as one.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from app.db.models.jobs import Job
from app.db.types import utcnow
from app.jobs import fairness, pauses
from app.jobs.states import JobStatus
from app.kinds import request_from_stored
from app.kinds.base import REFERENCE_PIXELS

RECENT_JOBS = 20
SIZE_SAMPLE = 200  # queued jobs read for their mean image size


def work(stored: dict[str, Any] | None) -> float:
    """Units of work of a stored request, as its job kind counts them (`JobRequest.work`):
    steps x images x (pixels / 512^2)."""
    return request_from_stored(stored or {}).work


def size(stored: dict[str, Any] | None) -> float:
    """One step of one image of a stored request, in units: its pixels / 512^2."""
    request = request_from_stored(stored or {})
    return request.width * request.height / REFERENCE_PIXELS


def mean_size(session: Session, *where: Any) -> float:
    """The mean `size` of (up to SIZE_SAMPLE of) the jobs matching `where`: the cost in
    units of one step of one of their images, where only their `work_units` (steps x
    images) are summed in SQL. 1.0 when none matches."""
    inputs = session.scalars(select(Job.input).where(*where).limit(SIZE_SAMPLE)).all()
    return statistics.fmean(size(stored) for stored in inputs) if inputs else 1.0


@dataclass(frozen=True)
class QueueInfo:
    # Jobs that will be delivered before this one; 0 means next (None: it is running).
    position: int | None
    eta_seconds: float | None  # None until the model has finished a job, or while paused
    paused: bool | None = None  # queued on a paused model (None: not asked, not queued)


@dataclass(frozen=True)
class CostModel:
    """run seconds ~ fixed + per_unit x work units, fitted to recent successes."""

    fixed: float
    per_unit: float

    def seconds(self, units: float) -> float:
        return self.fixed + self.per_unit * units


def fit(samples: list[tuple[float, float]]) -> CostModel | None:
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


def recent_runs(session: Session, model: str) -> list[tuple[float, float]]:
    """(work units, seconds run) of the model's last RECENT_JOBS jobs that succeeded:
    what its cost is fitted to."""
    rows = session.execute(
        select(Job.input, Job.started_at, Job.finished_at)
        .where(Job.model == model, Job.status == JobStatus.SUCCEEDED)
        .order_by(Job.finished_at.desc())
        .limit(RECENT_JOBS)
    ).all()
    return [
        (work(params), (finished - started).total_seconds())
        for params, started, finished in rows
        if started and finished
    ]


def cost_model(session: Session, model: str) -> CostModel | None:
    return fit(recent_runs(session, model))


def denoising_left(progress: dict, elapsed: float) -> float | None:
    """A denoising job's seconds left at its own pace: the one its worker measured from its
    second step on (`seconds_per_step`), else its seconds since it started per step done.
    The latter counts loading and encoding the prompt as denoising: early in a run (and a
    long way into one whose model was loaded for it) it promised twice the time left."""
    step, total = progress.get("step", 0), progress.get("total_steps", 0)
    if progress.get("stage") != "denoising" or not 0 < step < total:
        return None
    pace = progress.get("seconds_per_step")
    if pace is None:
        pace = elapsed / step
    return pace * (total - step)


def time_left(cost: CostModel, units: float, progress: dict | None, elapsed: float) -> float:
    """A running job's time left: from its own pace once it is denoising, else the model."""
    left = denoising_left(progress or {}, elapsed)
    return max(0.0, cost.seconds(units) - elapsed) if left is None else left


def at_pace_now(cost: CostModel, running: Sequence[tuple[Any, Any]]) -> CostModel:
    """`cost` at the machine's speed now: where a job of the queue (`running`: each one's
    stored input and progress) is denoising at a measured pace (`seconds_per_step`), the
    others are charged at that pace (the median of those running), their fixed part
    scaled alike. The recent runs it was fitted to may have run on a machine three times
    as busy, or as idle, as now."""
    paces = []
    for params, progress in running:
        progress = progress or {}
        pace, total = progress.get("seconds_per_step"), progress.get("total_steps", 0)
        units = work(params)
        if progress.get("stage") == "denoising" and pace and total > 0 and units > 0:
            paces.append(pace * total / units)
    if not paces or cost.per_unit <= 0:
        return cost
    per_unit = statistics.median(paces)
    return CostModel(cost.fixed * per_unit / cost.per_unit, per_unit)


def running_eta(job: Job) -> QueueInfo | None:
    """A running job's seconds left, from its own pace once it is denoising (a long clip's
    "about 3 minutes left"); None before its first step."""
    if job.started_at is None:
        return None
    elapsed = max(0.0, (utcnow() - job.started_at).total_seconds())
    left = denoising_left(job.progress or {}, elapsed)
    return None if left is None else QueueInfo(None, round(left, 1))


def fair_window(settings) -> float | None:
    """The window that fair share compares, or None when fair share is off."""
    return settings.fair_share_window if settings.fair_share else None


def queue_info(session: Session, job: Job, fair_window: float | None = None) -> QueueInfo:
    """With `fair_window` (fair share on), the position follows the tenants' turns."""
    if fair_window is not None:
        position, units_ahead = fairness.position(session, job, utcnow(), fair_window)
    else:
        position, units_ahead = _fifo_position(session, job)
    if pauses.is_paused(session, job.model):  # no start can be promised
        return QueueInfo(position, None, paused=True)
    cost = cost_model(session, job.model)
    if cost is None:
        return QueueInfo(position, None, paused=False)
    running = session.execute(
        select(Job.started_at, Job.input, Job.progress).where(
            Job.queue == job.queue, Job.status == JobStatus.RUNNING
        )
    ).all()
    cost = at_pace_now(cost, [(params, progress) for _, params, progress in running])
    now = utcnow()
    remaining = sum(
        time_left(cost, work(params), progress, (now - started).total_seconds())
        for started, params, progress in running
        if started
    )
    # The positions count steps x images; the jobs queued on it say how large each is.
    queued = (Job.queue == job.queue, Job.status == JobStatus.QUEUED)
    each = mean_size(session, *queued) if units_ahead else 1.0
    waiting = position * cost.fixed + units_ahead * each * cost.per_unit
    # Jobs running now are the best count of workers on this queue (at least one).
    workers = max(1, len(running))
    return QueueInfo(position, round((waiting + remaining) / workers, 1), paused=False)


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
