"""Priority aging: a long-waiting job is republished one priority level up, so low never
starves."""

from __future__ import annotations

import logging

from app.broker.publish import Publisher
from app.db.models.jobs import Job
from app.db.session import Database
from app.db.types import utcnow
from app.jobs import service, transitions
from app.jobs.states import JobStatus

log = logging.getLogger(__name__)

# AMQP priorities of low, normal, high; aging moves a waiting job up this ladder.
PRIORITY_LADDER = (1, 5, 9)


def aged_priority(job: Job, waited_seconds: float, aging_seconds: float) -> int:
    """One step up the ladder for every `aging_seconds` waited, from the requested level."""
    start = PRIORITY_LADDER.index(job.priority.amqp)
    steps = int(waited_seconds // aging_seconds) if aging_seconds > 0 else 0
    return PRIORITY_LADDER[min(len(PRIORITY_LADDER) - 1, start + steps)]


def promote_starving(db: Database, publisher: Publisher, *, aging_seconds: float) -> int:
    """Republish long-waiting jobs at a higher priority, so low never starves.

    The old message stays in the queue; when it is delivered, the job is already running
    or finished and the duplicate is acked without a second run.
    """
    with db.session() as session:
        ids = service.starving_job_ids(
            session, waited_seconds=aging_seconds, below=PRIORITY_LADDER[-1]
        )
    promoted = 0
    for job_id in ids:
        with db.session() as session:
            job = session.get(Job, job_id)
            if job is not None:
                session.expunge(job)  # edited below for the message only, never flushed
        if job is None or job.status != JobStatus.QUEUED:
            continue
        target = aged_priority(job, (utcnow() - job.created_at).total_seconds(), aging_seconds)
        if target <= job.publish_priority:
            continue
        job.publish_priority = target
        if publisher.publish(job):
            with db.session() as session:
                transitions.change(
                    session, job_id, Job.status == JobStatus.QUEUED, publish_priority=target
                )
            promoted += 1
    if promoted:
        log.info("promoted %d long-waiting job(s) one priority level", promoted)
    return promoted
