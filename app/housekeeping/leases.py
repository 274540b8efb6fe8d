"""Lost workers: running jobs whose lease expired are requeued or failed."""

from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from app.db.session import Database
from app.jobs import service, transitions

log = logging.getLogger(__name__)

# PostgreSQL's lock_not_available: the reap waited `lock_timeout` for the job's row.
LOCK_NOT_AVAILABLE = "55P03"


def reap_lost_jobs(db: Database, *, max_attempts: int, restart_grace: float = 0.0) -> int:
    """Running jobs whose lease expired are requeued (published by the next outbox pass)
    or failed past the attempt cap, so that nothing stays `running` forever. For
    `restart_grace` seconds after the database started (the relay gives a lease's
    length), none is: their workers could not renew while it was down
    (`service.lease_expired_jobs`).

    A row locked by another session (its worker frozen mid-transaction: the database
    ends that session after the worker's idle-transaction limit) is passed over after a
    second and tried again at the next pass: one such row never stalls the relay's pass,
    nor the other jobs' reaping."""
    with db.session() as session:
        jobs = service.lease_expired_jobs(session, restart_grace=restart_grace)
        for job in jobs:
            session.expunge(job)
    reaped = 0
    for job in jobs:
        try:
            with db.session() as session:
                if session.get_bind().dialect.name == "postgresql":
                    session.execute(text("SET LOCAL lock_timeout = '1s'"))
                outcome = transitions.reap(session, job, max_attempts=max_attempts)
        except OperationalError as exc:
            if getattr(exc.orig, "pgcode", None) != LOCK_NOT_AVAILABLE:
                raise
            log.info("job %s: lease expired, row still locked; next pass", job.id)
            continue
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
