"""Housekeeping passes run by `diffq relay`: the outbox, lost workers, deadlines, aging."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from app.db.models import Job
from app.db.session import Database
from app.db.types import utcnow
from app.jobs import service, transitions
from app.jobs.states import JobStatus
from app.limits import admit_held, forget_old_windows, tenants_with_held_jobs
from app.publish import Publisher, publish_and_mark
from app.purge import purge_finished_jobs
from app.retention import remove_expired_results
from app.storage import Storage
from app.webhooks import events as webhook_events

log = logging.getLogger(__name__)

# AMQP priorities of low, normal, high; aging moves a waiting job up this ladder.
PRIORITY_LADDER = (1, 5, 9)


@dataclass(frozen=True)
class RelayReport:
    published: int = 0
    expired: int = 0
    promoted: int = 0
    reaped: int = 0
    webhooks: int = 0


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


def release_held(db: Database, publisher: Publisher, *, cap: int) -> int:
    """Let held jobs through as their tenants' jobs in flight finish."""
    with db.session() as session:
        tenants = tenants_with_held_jobs(session)
    released = 0
    for tenant_id in tenants:
        with db.session() as session:
            admitted = admit_held(session, tenant_id, cap)
            jobs = [session.get(Job, job_id) for job_id in admitted]
        for job in jobs:
            # A failed publish leaves it admitted and unpublished: the outbox has it.
            publish_and_mark(db, publisher, job)
        released += len(jobs)
    if released:
        log.info("released %d held job(s) to the broker", released)
    return released


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


def cancel_expired(db: Database) -> int:
    """Queued jobs past their cancel_after end canceled/deadline, worker or not."""
    with db.session() as session:
        ids = service.expired_job_ids(session)
        expired = sum(transitions.cancel_expired(session, job_id) for job_id in ids)
    if expired:
        log.info("canceled %d queued job(s) past their deadline", expired)
    return expired


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


def relay_pass(
    db: Database,
    publisher: Publisher,
    *,
    relay_after: float,
    aging: float,
    max_attempts: int,
    webhook_lease: float = 60.0,
    storage: Storage | None = None,
    retention: float = 0.0,
    max_running: int = 0,
    job_retention: float = 0.0,
) -> RelayReport:
    reaped = reap_lost_jobs(db, max_attempts=max_attempts)
    release_held(db, publisher, cap=max_running)
    with db.session() as session:
        forget_old_windows(session)
    if storage is not None:
        remove_expired_results(db, storage, retention_seconds=retention)
    purge_finished_jobs(db, retention_seconds=job_retention)
    return RelayReport(
        published=publish_unpublished(db, publisher, older_than_seconds=relay_after),
        expired=cancel_expired(db),
        promoted=promote_starving(db, publisher, aging_seconds=aging),
        reaped=reaped,
        webhooks=dispatch_webhooks(db, publisher, lease_seconds=webhook_lease),
    )
