"""Job retention: past DIFFQ_JOB_RETENTION, a finished job's row goes, with its webhook
events and their attempts.

Run by the relay in small batches, each its own short transaction that deletes rows
nobody writes any more (terminal jobs), picked with `FOR UPDATE SKIP LOCKED` on
PostgreSQL so a purge never waits on, or blocks, a hot row. A succeeded job whose images
are still kept (DIFFQ_RESULT_RETENTION) stays until they are removed: deleting the row
first would orphan its objects in the store.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import delete, or_, select

from app.db.models.jobs import Job
from app.db.models.webhooks import WebhookAttempt, WebhookEvent
from app.db.session import Database, unclaimed_ids
from app.db.types import utcnow
from app.jobs.states import JobStatus

log = logging.getLogger(__name__)

TERMINAL = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED)
BATCH = 200
MAX_BATCHES_PER_PASS = 10


def purge_finished_jobs(
    db: Database,
    *,
    retention_seconds: float,
    batch: int = BATCH,
    max_batches: int = MAX_BATCHES_PER_PASS,
) -> int:
    """Delete up to `max_batches` batches of jobs finished before the retention period;
    returns how many jobs went."""
    if retention_seconds <= 0:
        return 0
    cutoff = utcnow() - timedelta(seconds=retention_seconds)
    purged = 0
    for _ in range(max_batches):
        with db.session() as session:
            pick = (
                select(Job.id)
                .where(
                    Job.status.in_(TERMINAL),
                    Job.finished_at < cutoff,
                    or_(Job.status != JobStatus.SUCCEEDED, Job.data_removed_at.is_not(None)),
                    Job.batch_id.is_(None),  # a batch's jobs go with it (app/batches)
                    Job.checkpoint_step.is_(None),  # its checkpoint goes first (retention)
                )
                .order_by(Job.finished_at)
                .limit(batch)
            )
            ids = unclaimed_ids(session, pick)
            if ids:
                events = select(WebhookEvent.id).where(WebhookEvent.job_id.in_(ids))
                session.execute(delete(WebhookAttempt).where(WebhookAttempt.event_id.in_(events)))
                session.execute(delete(WebhookEvent).where(WebhookEvent.job_id.in_(ids)))
                session.execute(delete(Job).where(Job.id.in_(ids)))
        purged += len(ids)
        if len(ids) < batch:
            break
    if purged:
        log.info("retention: purged %d finished job(s) with their webhook events", purged)
    return purged
