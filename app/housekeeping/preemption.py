"""Preemption: an urgent job waiting behind long jobs makes one of them yield.

A `high` job that has waited DIFFQ_PREEMPT_AFTER seconds has found no free worker of its
queue (a free one takes it within milliseconds). For each such job, the relay asks one
running job of the same queue to yield (app/jobs/transitions.py `request_yield`, as a
pause with `now` does): the run stores a checkpoint at its next step and goes back to the
queue without spending an attempt, the freed worker takes the urgent job (the broker
delivers priorities in order; fair share chooses by them too), and the long job resumes
from its checkpoint when a worker is free again.

The rule, so that no job starves:

- only a job of a lower requested priority (`low`, `normal`) that checkpoints (its model's
  `checkpoint_seconds` > 0) is preempted, never a `high` one;
- only one with more than DIFFQ_PREEMPT_MIN_LEFT seconds left at its own pace (a job near
  its end finishes: cheaper than a checkpoint and a reload), the one with the most left
  first;
- a job is preempted at most DIFFQ_MAX_PREEMPTIONS times (`jobs.preemptions`); after that
  it runs to its end, and priority aging still raises it while it waits;
- one victim per waiting urgent job, counting runs already yielding; none for a paused
  model.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import func, select

from app.catalog import Catalog
from app.db.models.jobs import Job
from app.db.session import Database
from app.db.types import utcnow
from app.jobs import pauses, transitions
from app.jobs.queue_info import denoising_left
from app.jobs.states import JobStatus, Priority

log = logging.getLogger(__name__)

YIELD_PREEMPTED = "preempted"


def seconds_left(job: Job, now) -> float | None:
    """A running job's denoising time left at the pace its worker measured (the queue's
    ETA's: app/jobs/queue_info.py); None before its first step (loading, or just resumed)."""
    if job.started_at is None:
        return None
    return denoising_left(job.progress or {}, (now - job.started_at).total_seconds())


def preempt_for_urgent(
    db: Database,
    catalog: Catalog,
    *,
    after_seconds: float,
    min_left_seconds: float,
    max_preemptions: int,
) -> int:
    """One pass: ask a long job to yield for each urgent job waiting; returns how many."""
    if after_seconds <= 0 or max_preemptions <= 0:
        return 0
    checkpointing = [m.name for m in catalog.models.values() if m.checkpoint_seconds > 0]
    if not checkpointing:
        return 0
    asked = 0
    with db.session() as session:
        now = utcnow()
        paused = list(pauses.paused(session))
        waiting = session.execute(
            select(Job.queue, func.count())
            .where(
                Job.status == JobStatus.QUEUED,
                Job.priority == Priority.HIGH,
                Job.admitted_at.is_not(None),
                Job.created_at <= now - timedelta(seconds=after_seconds),
                Job.model.not_in(paused) if paused else True,
            )
            .group_by(Job.queue)
        ).all()
        for queue, urgent in waiting:
            running = session.scalars(
                select(Job).where(Job.queue == queue, Job.status == JobStatus.RUNNING)
            ).all()
            yielding = sum(1 for job in running if job.yield_reason is not None)
            candidates = sorted(
                (
                    (left, job.id)
                    for job in running
                    if job.priority != Priority.HIGH
                    and job.yield_reason is None
                    and job.preemptions < max_preemptions
                    and job.model in checkpointing
                    and (left := seconds_left(job, now)) is not None
                    and left > min_left_seconds
                ),
                reverse=True,
            )
            for left, job_id in candidates[: max(0, urgent - yielding)]:
                if transitions.request_yield(
                    session,
                    Job.id == job_id,
                    Job.yield_reason.is_(None),
                    reason=YIELD_PREEMPTED,
                    preemptions=Job.preemptions + 1,
                ):
                    asked += 1
                    log.info(
                        "preempting job %s (%.0fs left) for %d urgent job(s) waiting on %s",
                        job_id,
                        left,
                        urgent,
                        queue,
                        extra={"job_id": str(job_id)},
                    )
    return asked
