"""A batch from its ingest to its end: counts per state, the status shown, cancel, the
completion window, the end (files, the completion webhook) and the purge.

Stored statuses: `validating` (its lines are being stored) -> `in_progress` ->
`completed` | `expired`; a cancel: `cancelling` -> `cancelled` (or `failed`, for an
ingest that died and was never retried). `finalizing` is what an `in_progress` batch
whose every job has ended shows until its end is recorded: the end is one conditional
UPDATE that anyone may make (the relay's pass, or the API when it reads the batch), so
it happens once, with its output and error files and its webhook event in the same
transaction. The files are rendered from the jobs when read (app/batches/render.py),
so their image links are fresh whenever they are downloaded.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from app.db import clock
from app.db.models.batches import Batch, BatchFile
from app.db.models.jobs import Job
from app.db.models.webhooks import WebhookAttempt, WebhookEvent
from app.db.types import utcnow
from app.ids import uuid7
from app.jobs import transitions
from app.jobs.states import ErrorCode, JobStatus

ENDED = ("completed", "expired", "cancelled", "failed")
OPEN = ("validating", "in_progress", "cancelling")
EVENTS = {status: f"batch.{status}" for status in ENDED}
# An ingest whose batch has not moved for this long died (its request's process ended)
# and was not retried with its Idempotency-Key: what it stored is cancelled.
ABANDONED_AFTER = 120.0


def job_counts(session: Session, batch_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, Counter]:
    """Jobs per state of each batch (an index of (batch_id, status) answers it)."""
    ids = list(batch_ids)
    found: dict[uuid.UUID, Counter] = {batch_id: Counter() for batch_id in ids}
    if not ids:
        return found
    rows = session.execute(
        select(Job.batch_id, Job.status, func.count())
        .where(Job.batch_id.in_(ids))
        .group_by(Job.batch_id, Job.status)
    )
    for batch_id, status, count in rows:
        found[batch_id][JobStatus(status).value] = count
    return found


def counts_of(batch: Batch, jobs: Counter) -> dict[str, int]:
    """Every line in exactly one count: queued, running, succeeded, failed, canceled,
    expired (not started within the window), invalid (refused on its own), and while
    the lines are still being stored, `pending`."""
    if batch.counts is not None:
        return dict(batch.counts)
    canceled = jobs["canceled"] - batch.expired
    counted = {
        "total": batch.total,
        "queued": jobs["queued"],
        "running": jobs["running"],
        "succeeded": jobs["succeeded"],
        "failed": jobs["failed"],
        "canceled": max(0, canceled),
        "expired": batch.expired,
        "invalid": batch.invalid,
    }
    stored = sum(jobs.values())
    counted["pending"] = max(0, batch.total - batch.invalid - stored)
    return counted


def shown_status(batch: Batch, counts: dict[str, int]) -> str:
    if batch.status == "in_progress" and not (
        counts["queued"] or counts["running"] or counts.get("pending")
    ):
        return "finalizing"
    return batch.status


def cancel(session: Session, batch: Batch) -> list[tuple[uuid.UUID, JobStatus]]:
    """Cancel the batch: its queued jobs at once, its running ones at their next step
    (their workers are told), finished ones kept. Returns the jobs it ended, each with the
    status it left (the queued ones' messages can go: `Broker.discard`). The caller
    commits."""
    now = utcnow()
    moved = session.execute(
        update(Batch)
        .where(Batch.id == batch.id, Batch.status.in_(("validating", "in_progress")))
        .values(status="cancelling", cancelling_at=now, updated_at=now)
    ).rowcount
    if not moved and batch.status != "cancelling":
        return []
    return _cancel_jobs(session, batch.id)


def _cancel_jobs(session: Session, batch_id: uuid.UUID) -> list:
    return transitions.cancel_many(
        session,
        Job.batch_id == batch_id,
        code=ErrorCode.CANCELED,
        message="its batch was cancelled",
    )


def expire(session: Session, batch: Batch) -> list[uuid.UUID]:
    """The completion window ended: the batch's jobs not started yet end canceled with
    code `expired`; running ones finish. Returns the jobs it ended (their messages can
    go: `Broker.discard`). The caller commits."""
    ended = transitions.cancel_many(
        session,
        Job.batch_id == batch.id,
        statuses=(JobStatus.QUEUED,),
        code=ErrorCode.EXPIRED,
        message="not started within its batch's completion window",
    )
    now = utcnow()
    session.execute(
        update(Batch)
        .where(Batch.id == batch.id, Batch.expired_at.is_(None))
        .values(expired_at=now, expired=Batch.expired + len(ended), updated_at=now)
    )
    return [job_id for job_id, _ in ended]


def finish(session: Session, batch: Batch) -> bool:
    """Record the batch's end if every line has: its final status and counts, its output
    and error files, its webhook event, in one transaction with a conditional UPDATE (so
    once, whoever calls). False when something is still to run. The caller commits."""
    if batch.finished_at is not None or batch.status == "validating":
        return False
    if batch.in_progress_at is None and not batch.errors:
        return False  # cancelled while its lines are still being stored: wait for them
    if batch.status == "cancelling":
        _cancel_jobs(session, batch.id)  # any job an ingest stored after the cancel
    jobs = job_counts(session, [batch.id])[batch.id]
    counts = counts_of(batch, jobs)
    if counts["queued"] or counts["running"]:
        return False
    if batch.status == "in_progress" and counts["pending"]:
        return False  # cannot happen: in_progress means every line is stored
    final = {
        "in_progress": "expired" if batch.expired_at is not None else "completed",
        "cancelling": "failed" if batch.errors else "cancelled",
    }[batch.status]
    now = utcnow()
    last = session.scalar(select(func.max(Job.finished_at)).where(Job.batch_id == batch.id))
    output_id = uuid7() if counts["succeeded"] else None
    errors_id = uuid7() if batch.total - counts["succeeded"] - counts["pending"] else None
    won = session.execute(
        update(Batch)
        .where(Batch.id == batch.id, Batch.finished_at.is_(None), Batch.status == batch.status)
        .values(
            status=final,
            finished_at=now,
            finalizing_at=last or now,
            updated_at=now,
            counts=counts,
            output_file_id=output_id,
            error_file_id=errors_id,
        )
        # Not onto the loaded object: when another process recorded the end first, the
        # update matches no row, and the ORM's "synchronize" would still give the object
        # this call's file ids, which no row has (a reader then got a 404 for them).
        .execution_options(synchronize_session=False)
    ).rowcount
    if not won:
        session.expire(batch)  # read again: the end another process recorded
        return False
    short = batch.id.hex[:12]
    for file_id, purpose, name in (
        (output_id, "batch_output", f"batch_{short}_output.jsonl"),
        (errors_id, "batch_error", f"batch_{short}_error.jsonl"),
    ):
        if file_id is not None:
            session.execute(
                insert(BatchFile).values(
                    id=file_id,
                    tenant_id=batch.tenant_id,
                    purpose=purpose,
                    filename=name,
                    created_at=now,
                    batch_id=batch.id,
                )
            )
    if batch.webhook_url:
        session.execute(
            insert(WebhookEvent).values(
                id=uuid7(),
                job_id=None,
                batch_id=batch.id,
                type=EVENTS[final],
                created_at=now,
                next_attempt_at=clock.now(session),
                state="pending",
                attempts=0,
            )
        )
    return True


def abandon(session: Session, batch: Batch) -> int:
    """An ingest that died and was not retried: what it stored is cancelled and the
    batch ends `failed`, saying how far it got. The caller commits."""
    stored = sum(job_counts(session, [batch.id])[batch.id].values())
    now = utcnow()
    errors = {
        "object": "list",
        "data": [
            {
                "code": "ingest_interrupted",
                "message": f"The batch's lines stopped being stored after {stored} of "
                f"{batch.total - batch.invalid}; retry it with the same Idempotency-Key to "
                "store the rest, or submit it again.",
                "param": None,
                "line": None,
            }
        ],
    }
    moved = session.execute(
        update(Batch)
        .where(Batch.id == batch.id, Batch.status == "validating")
        .values(status="cancelling", cancelling_at=now, updated_at=now, errors=errors)
    ).rowcount
    return len(_cancel_jobs(session, batch.id)) if moved else 0


def open_batches(session: Session, limit: int = 200) -> list[Batch]:
    return list(
        session.scalars(
            select(Batch).where(Batch.finished_at.is_(None)).order_by(Batch.id).limit(limit)
        )
    )


def housekeep(
    session_factory,
    *,
    now_factory=utcnow,
    discard: Callable[[list[uuid.UUID]], object] | None = None,
) -> dict[str, int]:
    """The relay's step for batches: expire what its window ended (the expired jobs'
    messages given to `discard` once committed), end abandoned ingests, record the end of
    every batch whose lines all ended."""
    done: Counter = Counter()
    with session_factory() as session:
        ids = [batch.id for batch in open_batches(session)]
    for batch_id in ids:
        with session_factory() as session:
            batch = session.get(Batch, batch_id, with_for_update=False)
            if batch is None or batch.finished_at is not None:
                continue
            now = now_factory()
            if batch.status == "validating":
                if batch.updated_at < now - timedelta(seconds=ABANDONED_AFTER):
                    abandon(session, batch)
                    done["abandoned"] += 1
                    session.commit()
                    session.refresh(batch)
                else:
                    continue
            if (
                batch.status == "in_progress"
                and batch.expires_at is not None
                and batch.expires_at <= now
                and batch.expired_at is None
            ):
                expired = expire(session, batch)
                done["expired_jobs"] += len(expired)
                session.commit()
                if discard is not None:
                    discard(expired)
                session.refresh(batch)
            if finish(session, batch):
                done["ended"] += 1
            session.commit()
    return dict(done)


def purge(session: Session, cutoff, limit: int = 20) -> int:
    """Batches that ended before `cutoff` go with their jobs, files and webhook events
    (a batch's jobs are purged with it, not one by one: its files are made of them)."""
    kept_images = (
        select(Job.id)
        .where(
            Job.batch_id == Batch.id,
            Job.status == JobStatus.SUCCEEDED,
            Job.data_removed_at.is_(None),
        )
        .exists()
    )
    ids = list(
        session.scalars(
            select(Batch.id)
            .where(Batch.finished_at.is_not(None), Batch.finished_at < cutoff, ~kept_images)
            .limit(limit)
        )
    )
    for batch_id in ids:
        jobs = select(Job.id).where(Job.batch_id == batch_id)
        events = select(WebhookEvent.id).where(
            (WebhookEvent.job_id.in_(jobs)) | (WebhookEvent.batch_id == batch_id)
        )
        session.execute(delete(WebhookAttempt).where(WebhookAttempt.event_id.in_(events)))
        session.execute(
            delete(WebhookEvent).where(
                (WebhookEvent.job_id.in_(jobs)) | (WebhookEvent.batch_id == batch_id)
            )
        )
        session.execute(delete(Job).where(Job.batch_id == batch_id))
        session.execute(
            delete(BatchFile).where(BatchFile.batch_id == batch_id, BatchFile.storage_key.is_(None))
        )
        session.execute(delete(Batch).where(Batch.id == batch_id))
    return len(ids)


def summary(batch: Batch, counts: dict[str, int]) -> dict[str, Any]:
    """OpenAI's request_counts: done well, done otherwise (failed, canceled, expired,
    refused), of all."""
    done_otherwise = counts["failed"] + counts["canceled"] + counts["expired"] + counts["invalid"]
    return {"total": batch.total, "completed": counts["succeeded"], "failed": done_otherwise}
