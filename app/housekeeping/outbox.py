"""The outboxes' backstop: queued jobs whose first publish was never confirmed, and
webhook events due for (another) delivery, handed to the broker."""

from __future__ import annotations

import logging
from datetime import timedelta

from app.broker.publish import Publisher, publish_and_mark
from app.db.models.jobs import Job
from app.db.session import Database
from app.db.types import utcnow
from app.jobs import service
from app.jobs.states import JobStatus
from app.webhooks import events as webhook_events

log = logging.getLogger(__name__)


def publish_unpublished(db: Database, publisher: Publisher, *, older_than_seconds: float) -> int:
    """Publish queued jobs whose first publish never got confirmed; returns how many."""
    cutoff = utcnow() - timedelta(seconds=older_than_seconds)
    with db.session() as session:
        ids = service.unpublished_job_ids(session, cutoff)
    published = 0
    for job_id in ids:
        with db.session() as session:
            job = session.get(Job, job_id)
        if job is None or job.published_at is not None or job.status != JobStatus.QUEUED:
            continue
        if not publish_and_mark(db, publisher, job):
            break  # the broker is still away; try again on the next pass
        published += 1
    if published:
        log.info("relay published %d job(s) that had missed their first publish", published)
    return published


def dispatch_webhooks(db: Database, publisher: Publisher, *, lease_seconds: float) -> int:
    """Hand due webhook events to the delivery workers (the `webhooks` queue). An event
    whose worker vanished is handed out again once its lease ends; a receiver sees it
    at least once, always with the same webhook-id."""
    with db.session() as session:
        due = webhook_events.due(session, lease_seconds=lease_seconds)
    sent = sum(publisher.publish_webhook(event_id) for event_id in due)
    if sent:
        log.info("dispatched %d webhook event(s)", sent)
    return sent
