"""Lost workers: running jobs whose lease expired are requeued or failed."""

from __future__ import annotations

import logging

from app.db.session import Database
from app.jobs import service, transitions

log = logging.getLogger(__name__)


def reap_lost_jobs(db: Database, *, max_attempts: int) -> int:
    """Running jobs whose lease expired are requeued (published by the next outbox pass)
    or failed past the attempt cap, so that nothing stays `running` forever."""
    with db.session() as session:
        jobs = service.lease_expired_jobs(session)
        for job in jobs:
            session.expunge(job)
    reaped = 0
    for job in jobs:
        with db.session() as session:
            outcome = transitions.reap(session, job, max_attempts=max_attempts)
        if outcome != transitions.ReapOutcome.SKIPPED:
            reaped += 1
            log.warning(
                "job %s: lease of %s expired; %s",
                job.id,
                job.lease_owner,
                outcome.value,
                extra={"job_id": str(job.id)},
            )
    return reaped
