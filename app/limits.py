"""Per-key request rate limits and per-tenant caps on queued jobs, kept in the database
so that every API process (and every API replica) enforces the same numbers."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import bindparam, delete, func, select, text, update
from sqlalchemy.orm import Session

from app.db.enums import JobStatus
from app.db.models.jobs import Job
from app.db.models.limits import RequestCount, SubmitReservation
from app.db.session import execute_alone, relaxed_commit
from app.db.types import utcnow

WINDOW_SECONDS = 60


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after: int = 0  # seconds, for the Retry-After header


def _count_statement(dialect: str):
    """The upsert that counts a request, built once per dialect."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    table = RequestCount.__table__
    statement = insert(table).values(
        key_id=bindparam("kid"), window_start=bindparam("win"), count=1
    )
    return statement.on_conflict_do_update(
        index_elements=["key_id", "window_start"], set_={"count": table.c.count + 1}
    ).returning(table.c.count)


_COUNT = {name: _count_statement(name) for name in ("postgresql", "sqlite")}


def count_request(session: Session, key_id: str, limit: int) -> Verdict:
    """Count one request against the key's current minute; over `limit` it is refused
    until the next minute starts. One atomic upsert: exact under concurrency. (On
    PostgreSQL the API counts inside the key's lookup instead: app/keys.py `admit`.)"""
    if limit <= 0:
        return Verdict(True)
    now = utcnow()
    window = window_of(now)
    relaxed_commit(session)  # a count lost in a crash lets one extra request through
    statement = _COUNT[session.get_bind().dialect.name]
    count = session.execute(statement, {"kid": key_id, "win": window}).scalar_one()
    session.commit()
    return rate_verdict(count, limit, window, now)


def window_of(now: datetime) -> datetime:
    """The start of the rate limit's window that `now` falls in."""
    epoch = int(now.timestamp()) // WINDOW_SECONDS * WINDOW_SECONDS
    return datetime.fromtimestamp(epoch, UTC)


def rate_verdict(count: int, limit: int, window: datetime, now: datetime) -> Verdict:
    """The `count`-th request of the window: over `limit`, refused until it ends."""
    if limit <= 0 or count <= limit:
        return Verdict(True)
    left = (window + timedelta(seconds=WINDOW_SECONDS) - now).total_seconds()
    return Verdict(False, max(1, math.ceil(left)))


def forget_old_windows(session: Session) -> int:
    """The relay's cleanup: counts of windows long past, and the slots of submits that
    died before storing their job (they stopped counting after RESERVATION_SECONDS)."""
    cutoff = utcnow() - timedelta(seconds=10 * WINDOW_SECONDS)
    session.execute(
        delete(SubmitReservation).where(
            SubmitReservation.created_at < utcnow() - timedelta(seconds=RESERVATION_SECONDS)
        )
    )
    return session.execute(delete(RequestCount).where(RequestCount.window_start < cutoff)).rowcount


_LOCK = text("SELECT pg_advisory_xact_lock(:key)")
_jobs = Job.__table__
_QUEUED = (
    select(func.count())
    .select_from(_jobs)
    .where(_jobs.c.tenant_id == bindparam("tenant"), _jobs.c.status == JobStatus.QUEUED.value)
)


def lock_tenant(session: Session, tenant_id: uuid.UUID) -> None:
    """A transaction-scoped lock per tenant (PostgreSQL): count-then-write decisions about
    one tenant's jobs are made one at a time across every process, until the commit or
    rollback that follows. (In SQLite a write waits for the writer before it.)"""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(_LOCK, {"key": uuid.UUID(str(tenant_id)).int & 0x7FFFFFFFFFFFFFFF})


def over_queued_cap(session: Session, tenant_id: uuid.UUID, cap: int) -> Verdict:
    """After the new job's INSERT, the tenant locked: is it within its cap of queued
    jobs (the new one counted)? Used where the in-flight cap already locks the tenant
    until the job's commit."""
    if cap <= 0:
        return Verdict(True)
    if session.execute(_QUEUED, {"tenant": tenant_id}).scalar_one() <= cap:
        return Verdict(True)
    return Verdict(False, 10)


RESERVATION_SECONDS = 60  # far beyond a live submit (statements time out after 15 s)
_reserved = SubmitReservation.__table__
_RESERVE = _reserved.insert()
_RESERVE_CALL = (
    "SELECT diffq_reserve_slot(%(job)s::uuid, %(tenant)s::uuid, %(cap)s, %(now)s, "
    "%(since)s, %(lock)s)"
)
_RELEASE = _reserved.delete().where(_reserved.c.job_id == bindparam("job"))
_TAKEN = select(
    _QUEUED.scalar_subquery()
    + select(func.count())
    .select_from(_reserved)
    .where(
        _reserved.c.tenant_id == bindparam("tenant"),
        _reserved.c.created_at > bindparam("since"),
    )
    .scalar_subquery()
)


def reserve_queued_slot(
    session: Session, tenant_id: uuid.UUID, job_id: uuid.UUID, cap: int
) -> Verdict:
    """Take a slot under the tenant's cap of queued jobs for a job about to be stored, in
    a transaction of its own that commits without waiting for the WAL flush: the
    tenant's lock is held inside one call and its commit, never across a job's
    durable commit, so a tenant's submits overlap while the cap stays exact (the slots
    of submits in progress are counted with the queued jobs). The job's transaction
    releases the slot (`release_slot`) as it stores the job."""
    if cap <= 0:
        return Verdict(True)
    now = utcnow()
    since = now - timedelta(seconds=RESERVATION_SECONDS)
    if session.get_bind().dialect.name == "postgresql":
        # The same steps in one call, in autocommit (migration 0008): the tenant's lock is
        # taken and released inside the server, with no round trip while it is held.
        params = {
            "job": str(job_id),
            "tenant": str(tenant_id),
            "cap": cap,
            "now": now,
            "since": since,
            "lock": uuid.UUID(str(tenant_id)).int & 0x7FFFFFFFFFFFFFFF,
        }
        (allowed,) = execute_alone(session, _RESERVE_CALL, params)[0]
        return Verdict(True) if allowed else Verdict(False, 10)
    # SQLite: the INSERT makes later writers wait until this commit.
    relaxed_commit(session)
    session.execute(_RESERVE, {"job_id": job_id, "tenant_id": tenant_id, "created_at": now})
    if queued_or_reserved(session, tenant_id, since) > cap:  # its own slot counted
        session.rollback()
        return Verdict(False, 10)
    session.commit()
    return Verdict(True)


def queued_or_reserved(session: Session, tenant_id: uuid.UUID, since: datetime) -> int:
    """The tenant's queued jobs plus the slots of its submits in progress (taken after
    `since`): typed statements, the same on PostgreSQL and SQLite."""
    return session.execute(_TAKEN, {"tenant": tenant_id, "since": since}).scalar_one()


def release_slot(session: Session, job_id: uuid.UUID) -> None:
    """In the job's transaction (or after it failed): the submit's slot is free again."""
    session.execute(_RELEASE, {"job": job_id})


def in_flight(session: Session, tenant_id: uuid.UUID) -> int:
    """The tenant's jobs let through to the broker and not finished: queued there, or
    running."""
    return session.scalar(
        select(func.count())
        .select_from(Job)
        .where(
            Job.tenant_id == tenant_id,
            Job.admitted_at.is_not(None),
            Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]),
        )
    )


def admit_new(session: Session, tenant_id: uuid.UUID, job_id: uuid.UUID, cap: int) -> bool:
    """After the new job's INSERT (admitted), the tenant locked: does it go to the broker
    now, or is it held (admitted_at cleared) until the relay lets it through?"""
    if cap <= 0 or in_flight(session, tenant_id) <= cap:
        return True
    session.execute(update(Job).where(Job.id == job_id).values(admitted_at=None))
    return False


def admit_held(session: Session, tenant_id: uuid.UUID, cap: int) -> list[uuid.UUID]:
    """The relay's release: let the tenant's held jobs through, best priority and oldest
    first, while it is under its cap (all of them when there is no cap any more)."""
    lock_tenant(session, tenant_id)
    free = cap - in_flight(session, tenant_id) if cap > 0 else None
    if free is not None and free <= 0:
        return []
    held = (
        select(Job.id)
        .where(
            Job.tenant_id == tenant_id,
            Job.admitted_at.is_(None),
            Job.status == JobStatus.QUEUED,
        )
        .order_by(Job.publish_priority.desc(), Job.id)
        .limit(free if free is not None else 1000)
    )
    ids = list(session.scalars(held))
    if ids:
        session.execute(update(Job).where(Job.id.in_(ids)).values(admitted_at=utcnow()))
    return ids


def tenants_with_held_jobs(session: Session) -> list[uuid.UUID]:
    held = Job.admitted_at.is_(None) & (Job.status == JobStatus.QUEUED)
    return list(session.scalars(select(Job.tenant_id).where(held).distinct()))
