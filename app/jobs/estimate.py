"""How long a job of a given size would take on a model, asked before it is submitted.

One unit of work is one denoising step of one 512 x 512 image (app/kinds `JobRequest.work`;
the queue's ETA, app/jobs/queue_info.py, counts in the same unit), so a 1024 x 1024 step
is four units and an img2img job at strength 0.5 half its steps: with a VAE
that downsamples by 8 (every Stable Diffusion VAE), the work grows with the pixels. The
same fit (fixed + per unit) is made to the model's recent successes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.models.jobs import Job
from app.db.types import utcnow
from app.jobs.queue_info import CostModel, at_pace_now, fit, recent_runs, time_left, work
from app.jobs.states import JobStatus
from app.kinds import JobRequest

# Queued jobs read to price the queue; beyond this the rest are priced at their mean.
QUEUE_SAMPLE = 500


@dataclass(frozen=True)
class Estimate:
    run_seconds: float | None  # None until the model has finished a job
    queue_seconds: float | None  # until a worker would take it, at normal priority
    queued: int  # jobs waiting on the model's queue now
    running: int  # jobs running on it now
    samples: int  # finished jobs the fit is made from


def size_cost_model(session: Session, model: str) -> tuple[CostModel | None, int]:
    samples = recent_runs(session, model)
    return fit(samples), len(samples)


def estimate(
    session: Session, model: str, queue: str, request: JobRequest, share: float = 1.0
) -> Estimate:
    """`share`: the part of the request's work its quality tier does (`Tier.work_share`);
    the queue's jobs are counted at their full work, an upper bound for cheaper tiers."""
    cost, samples = size_cost_model(session, model)
    queued_inputs = (
        session.execute(
            select(Job.input)
            .where(Job.queue == queue, Job.status == JobStatus.QUEUED)
            .limit(QUEUE_SAMPLE)
        )
        .scalars()
        .all()
    )
    queued = len(queued_inputs)
    if queued == QUEUE_SAMPLE:
        queued = session.scalar(
            select(func.count()).where(Job.queue == queue, Job.status == JobStatus.QUEUED)
        )
    running = session.execute(
        select(Job.input, Job.started_at, Job.progress).where(
            Job.queue == queue, Job.status == JobStatus.RUNNING
        )
    ).all()
    if cost is None:
        return Estimate(None, None, queued, len(running), samples)
    cost = at_pace_now(cost, [(params, progress) for params, _, progress in running])
    seen = [cost.seconds(work(params)) for params in queued_inputs]
    waiting = sum(seen) + (queued - len(seen)) * (sum(seen) / len(seen) if seen else 0.0)
    now = utcnow()
    left = sum(
        time_left(cost, work(params), progress, (now - started).total_seconds())
        for params, started, progress in running
        if started
    )
    workers = max(1, len(running))
    return Estimate(
        run_seconds=round(cost.seconds(request.work * share), 1),
        queue_seconds=round((waiting + left) / workers, 1),
        queued=queued,
        running=len(running),
        samples=samples,
    )
