"""Creating, finding and listing jobs; the outbox's and the relay's queries."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.db import clock
from app.db.models.jobs import Job
from app.db.types import utcnow
from app.jobs.states import JobStatus, Priority
from app.jobs.transitions import progress_of
from app.kinds import JobRequest


def create_job(
    session: Session,
    tenant_id: uuid.UUID,
    *,
    model: str,
    queue: str,
    priority: Priority,
    request: JobRequest,
    metadata: dict[str, Any] | None,
    deadline_seconds: int | None = None,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
    webhook_url: str | None = None,
    webhook_events: list[str] | None = None,
    admitted: bool = True,
) -> Job:
    """A queued job row for `request` (tests, benchmarks, tools; the API submits
    through app/jobs/submit.py)."""
    now = utcnow()
    job = Job(
        created_at=now,
        tenant_id=tenant_id,
        status=JobStatus.QUEUED,
        model=model,
        queue=queue,
        priority=priority,
        input=request.stored(),
        work_units=request.work_units,
        adapter_set=request.adapter_set,
        client_metadata=metadata,
        publish_priority=priority.amqp,
        progress=progress_of("queued", 0, request.denoise_steps),
        attempts=0,
        deadline_at=now + timedelta(seconds=deadline_seconds) if deadline_seconds else None,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        webhook_url=webhook_url,
        webhook_events=webhook_events,
        admitted_at=now if admitted else None,
    )
    session.add(job)
    session.flush()
    return job


def get_job(session: Session, tenant_id: uuid.UUID, job_id: uuid.UUID) -> Job | None:
    return session.scalar(select(Job).where(Job.id == job_id, Job.tenant_id == tenant_id))


def find_by_idempotency_key(session: Session, tenant_id: uuid.UUID, key: str) -> Job | None:
    return session.scalar(select(Job).where(Job.tenant_id == tenant_id, Job.idempotency_key == key))


def list_jobs(
    session: Session,
    tenant_id: uuid.UUID,
    *,
    limit: int,
    status: JobStatus | None = None,
    before: uuid.UUID | None = None,
) -> tuple[list[Job], uuid.UUID | None]:
    """Newest first; ids are time-ordered, so the last id seen is the cursor."""
    query = select(Job).where(Job.tenant_id == tenant_id)
    if status is not None:
        query = query.where(Job.status == status)
    if before is not None:
        query = query.where(Job.id < before)
    rows = list(session.scalars(query.order_by(Job.id.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1].id if more and rows else None)


def unpublished_job_ids(
    session: Session, older_than: datetime, limit: int = 100
) -> list[uuid.UUID]:
    """Queued jobs whose publish never got a broker confirm (the outbox's backlog)."""
    query = (
        select(Job.id)
        .where(
            Job.status == JobStatus.QUEUED,
            Job.published_at.is_(None),
            Job.admitted_at.is_not(None),  # held jobs wait for their tenant's slot
            Job.created_at < older_than,
        )
        .order_by(Job.created_at)
        .limit(limit)
    )
    return list(session.scalars(query))


def stranded_job_ids(
    session: Session, queues: list[str], seconds: float, limit: int = 1000
) -> list[uuid.UUID]:
    """Jobs of `queues` published at least `seconds` ago and still queued: asked while a
    worker of those queues sits idle, their messages are not reaching it
    (workers/stranded.py). Both times are the database's: a worker whose own clock is
    ahead would find every queued job old."""
    query = (
        select(Job.id)
        .where(
            Job.queue.in_(queues),
            Job.status == JobStatus.QUEUED,
            Job.published_at < clock.after(session, -seconds),
        )
        .order_by(Job.publish_priority.desc(), Job.id)
        .limit(limit)
    )
    return list(session.scalars(query))


def unpublish(session: Session, job_ids: list[uuid.UUID]) -> int:
    """Hand queued jobs back to the outbox: the relay publishes each again (a second
    message for a job is harmless: the claim runs it once). Returns how many."""
    result = session.execute(
        update(Job)
        .where(Job.id.in_(job_ids), Job.status == JobStatus.QUEUED, Job.published_at.is_not(None))
        .values(published_at=None, requeues=Job.requeues + 1)
    )
    return result.rowcount


def expired_job_ids(session: Session, limit: int = 500) -> list[uuid.UUID]:
    """Queued and running jobs whose cancel_after deadline has passed."""
    query = (
        select(Job.id)
        .where(Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]), Job.deadline_at <= utcnow())
        .limit(limit)
    )
    return list(session.scalars(query))


def starving_job_ids(
    session: Session, *, waited_seconds: float, below: int, limit: int = 100
) -> list[uuid.UUID]:
    """Queued jobs that have waited longer than `waited_seconds` at a priority below `below`,
    oldest first. In the order of the waiting jobs' index (`ix_jobs_waiting`), the scan
    stops at the first job younger than that: it reads the jobs due, never the history,
    nor every job waiting."""
    query = (
        select(Job.id)
        .where(
            Job.status == JobStatus.QUEUED,
            Job.admitted_at.is_not(None),  # a held job is not in the broker to promote
            Job.publish_priority < below,
            Job.created_at < utcnow() - timedelta(seconds=waited_seconds),
        )
        .order_by(Job.created_at, Job.id)
        .limit(limit)
    )
    return list(session.scalars(query))


def lease_expired_jobs(
    session: Session, *, limit: int = 100, restart_grace: float = 0.0
) -> list[Job]:
    """Running jobs whose worker stopped renewing its claim.

    With `restart_grace` (PostgreSQL), none while the database has been up for less than
    that: a lease that ran out while the database was down (a restart, a failover) says
    nothing of its worker, which renews it once it reaches the database again; reaped at
    once, a live run would lose its job and an attempt to the outage."""
    now = clock.now(session)
    conditions = [Job.status == JobStatus.RUNNING, Job.lease_expires_at < now]
    if restart_grace > 0 and session.get_bind().dialect.name == "postgresql":
        started = func.pg_postmaster_start_time()
        conditions.append(started < now - timedelta(seconds=restart_grace))
    query = select(Job).where(*conditions).order_by(Job.lease_expires_at).limit(limit)
    return list(session.scalars(query))
