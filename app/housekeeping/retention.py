"""Result retention: past DIFFQ_RESULT_RETENTION, a job's images are deleted from the
store and its result cleared; the job itself stays, marked `data_removed`. An input image
goes once its upload has expired and no job that may still run, or whose results are
kept, names it."""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import select

from app import uploads
from app.db.models.inputs import Upload
from app.db.models.jobs import Job
from app.db.session import Database
from app.db.types import utcnow
from app.jobs import transitions
from app.jobs.results import result_keys
from app.jobs.states import JobStatus
from app.storage import Storage, StorageError, checkpoint_key

log = logging.getLogger(__name__)

TERMINAL = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED)


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
            for key in [] if job.cached_from else result_keys(job.result):
                storage.delete(key)
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


def remove_left_checkpoints(db: Database, storage: Storage, *, limit: int = 100) -> int:
    """Checkpoints of jobs that ended without their worker removing them (canceled while
    queued after a hand-back, failed by the relay, a worker lost at the end): at once,
    since nothing will resume a finished job (workers/checkpoints.py)."""
    with db.session() as session:
        left = list(
            session.execute(
                select(Job.id, Job.tenant_id)
                .where(Job.checkpoint_step.is_not(None), Job.status.in_(TERMINAL))
                .limit(limit)
            )
        )
    removed = 0
    for job_id, tenant_id in left:
        try:
            storage.delete(checkpoint_key(tenant_id, job_id))
        except StorageError as exc:
            log.warning("retention: job %s checkpoint not deleted yet (%s)", job_id, exc)
            continue
        with db.session() as session:
            transitions.forget_checkpoint(session, job_id)
        removed += 1
    if removed:
        log.info("retention: removed %d finished job(s)' checkpoints", removed)
    return removed


def remove_unused_inputs(
    db: Database, storage: Storage, *, retention_seconds: float, limit: int = 100
) -> int:
    """Expired uploads' images, once no job needs them: not one still queued or running,
    nor one whose results are kept. An expired upload a job still needs is held for the
    job's retention again (a submit already holds it so; this is the safety net)."""
    now = utcnow()
    with db.session() as session:
        expired = list(
            session.scalars(
                select(Upload)
                .where(Upload.expires_at < now)
                .order_by(Upload.expires_at)
                .limit(limit)
            )
        )
    removed = 0
    for upload in expired:
        with db.session() as session:
            row = session.get(Upload, upload.id)
            if row is None:
                continue
            if uploads.needed(session, row):
                uploads.hold(row, retention_seconds or 0)
                session.commit()
                continue
            try:
                uploads.remove(session, storage, row)
            except StorageError as exc:
                log.warning("retention: input %s not deleted yet (%s)", row.sha256[:12], exc)
                continue
            removed += 1
    if removed:
        log.info("retention: removed %d unused input image(s)", removed)
    return removed
