"""Which events a job's webhook gets, recorded in the transaction of the change itself.

Importing this module subscribes `record_change` to every job change of the process
(app/jobs/changes.py): each process that changes jobs imports it at its entry point.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import exists, insert, select, update
from sqlalchemy.orm import Session

from app.db import clock
from app.db.models.webhooks import WebhookEvent
from app.db.session import unclaimed_ids
from app.ids import uuid7
from app.jobs.changes import JobChange, on_change, selected

PROGRESS_EVERY = timedelta(seconds=1)  # job.progress is coalesced to at most one a second
STATUS_EVENTS = {
    "running": "job.running",
    "succeeded": "job.succeeded",
    "failed": "job.failed",
    "canceled": "job.canceled",
}


def stopped(session: Session, job_id: uuid.UUID) -> bool:
    """The receiver answered 410 Gone for this job: nothing more is sent for it."""
    return bool(
        session.scalar(
            select(exists().where(WebhookEvent.job_id == job_id, WebhookEvent.state == "gone"))
        )
    )


def record(
    session: Session,
    job_id: uuid.UUID,
    *,
    status: str | None,
    progressed: bool,
    webhook_events: list[str] | None,
) -> None:
    """Called by every job change of a job that has a webhook."""
    wanted = selected(webhook_events)
    # The database's clock: the deliverer compares these with it, whatever the clock of
    # the worker recording the change says (app/db/clock.py).
    now = clock.now(session)
    event = STATUS_EVENTS.get(status or "")
    if event in wanted and not stopped(session, job_id):
        session.execute(
            insert(WebhookEvent).values(
                id=uuid7(),
                job_id=job_id,
                type=event,
                created_at=now,
                next_attempt_at=now,
                state="pending",
                attempts=0,
            )
        )
        return
    if progressed and status is None and "job.progress" in wanted:
        recent = exists().where(
            WebhookEvent.job_id == job_id,
            WebhookEvent.type == "job.progress",
            WebhookEvent.created_at > now - PROGRESS_EVERY,
        )
        if not session.scalar(select(recent)) and not stopped(session, job_id):
            session.execute(
                insert(WebhookEvent).values(
                    id=uuid7(),
                    job_id=job_id,
                    type="job.progress",
                    created_at=now,
                    next_attempt_at=now,
                    state="pending",
                    attempts=0,
                )
            )


@on_change
def record_change(session: Session, change: JobChange) -> None:
    """The change listener: a job with a webhook gets the events its change causes."""
    if change.webhook_url:
        record(
            session,
            change.job_id,
            status=change.status.value if change.status is not None else None,
            progressed=change.progressed,
            webhook_events=change.webhook_events,
        )


def due(session: Session, *, lease_seconds: float, limit: int = 200) -> list[uuid.UUID]:
    """Claim pending events whose time has come for a delivery worker (for
    `lease_seconds`; past that, an unfinished hand-out is handed out again)."""
    now = clock.now(session)
    query = (
        select(WebhookEvent.id)
        .where(
            WebhookEvent.state == "pending",
            WebhookEvent.next_attempt_at <= now,
            (WebhookEvent.dispatched_until.is_(None)) | (WebhookEvent.dispatched_until < now),
        )
        .order_by(WebhookEvent.next_attempt_at)
        .limit(limit)
    )
    ids = unclaimed_ids(session, query)
    if ids:
        session.execute(
            update(WebhookEvent)
            .where(WebhookEvent.id.in_(ids))
            .values(dispatched_until=now + timedelta(seconds=lease_seconds))
        )
    return ids
