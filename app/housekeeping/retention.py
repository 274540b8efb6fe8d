"""Result retention: past DIFFQ_RESULT_RETENTION, a job's images are deleted from the
store and its result cleared; the job itself stays, marked `data_removed`."""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import select

from app.db.models import Job
from app.db.session import Database
from app.db.types import utcnow
from app.jobs import transitions
from app.jobs.states import JobStatus
from app.storage import Storage, StorageError

log = logging.getLogger(__name__)


def remove_expired_results(
    db: Database, storage: Storage, *, retention_seconds: float, limit: int = 100
) -> int:
    if retention_seconds <= 0:
        return 0
    cutoff = utcnow() - timedelta(seconds=retention_seconds)
    with db.session() as session:
        jobs = list(
            session.scalars(
                select(Job)
                .where(
                    Job.status == JobStatus.SUCCEEDED,
                    Job.data_removed_at.is_(None),
                    Job.finished_at < cutoff,
                )
                .order_by(Job.finished_at)
                .limit(limit)
            )
        )
    removed = 0
    for job in jobs:
        try:
            # A cached copy's images are its source's: they go with the source.
            for image in [] if job.cached_from else (job.result or {}).get("images", []):
                storage.delete(image["key"])
        except StorageError as exc:
            log.warning("retention: job %s images not deleted yet (%s)", job.id, exc)
            continue  # the row keeps its result until the objects are gone
        with db.session() as session:
            removed += transitions.change(
                session,
                job.id,
                Job.data_removed_at.is_(None),
                result=None,
                data_removed_at=utcnow(),
            )
            copies = session.scalars(
                select(Job.id).where(Job.cached_from == job.id, Job.data_removed_at.is_(None))
            ).all()
            for copy_id in copies:  # their images were these
                transitions.change(
                    session,
                    copy_id,
                    Job.data_removed_at.is_(None),
                    result=None,
                    data_removed_at=utcnow(),
                )
    if removed:
        log.info("retention: removed the images of %d job(s)", removed)
    return removed
