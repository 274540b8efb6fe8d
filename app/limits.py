"""Per-key request rate limits and per-tenant caps on queued jobs, kept in the database
so that every API process (and every API replica) enforces the same numbers."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from app.db.models import Job, RequestCount
from app.db.types import utcnow
from app.jobs.states import JobStatus

WINDOW_SECONDS = 60


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after: int = 0  # seconds, for the Retry-After header


def count_request(session: Session, key_id: str, limit: int) -> Verdict:
    """Count one request against the key's current minute; over `limit` it is refused
    until the next minute starts. One atomic upsert: exact under concurrency."""
    if limit <= 0:
        return Verdict(True)
    now = utcnow()
    epoch = int(now.timestamp()) // WINDOW_SECONDS * WINDOW_SECONDS
    window = datetime.fromtimestamp(epoch, UTC)
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    statement = insert(RequestCount).values(key_id=key_id, window_start=window, count=1)
    statement = statement.on_conflict_do_update(
        index_elements=["key_id", "window_start"], set_={"count": RequestCount.count + 1}
    ).returning(RequestCount.count)
    count = session.execute(statement).scalar_one()
    session.commit()
    if count <= limit:
        return Verdict(True)
    left = (window + timedelta(seconds=WINDOW_SECONDS) - now).total_seconds()
    return Verdict(False, max(1, math.ceil(left)))


def forget_old_windows(session: Session) -> int:
    """The relay's cleanup: counts of windows long past."""
    cutoff = utcnow() - timedelta(seconds=10 * WINDOW_SECONDS)
    return session.execute(delete(RequestCount).where(RequestCount.window_start < cutoff)).rowcount


def reserve_queued_slot(session: Session, tenant_id: uuid.UUID, cap: int) -> Verdict:
    """Before inserting a job: is the tenant under its cap of queued jobs? On PostgreSQL
    a transaction-scoped advisory lock per tenant makes count-then-insert exact across
    processes (released by the commit or rollback that follows)."""
    if cap <= 0:
        return Verdict(True)
    if session.get_bind().dialect.name == "postgresql":
        key = uuid.UUID(str(tenant_id)).int & 0x7FFFFFFFFFFFFFFF
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
    queued = session.scalar(
        select(func.count())
        .select_from(Job)
        .where(Job.tenant_id == tenant_id, Job.status == JobStatus.QUEUED)
    )
    if queued < cap:
        return Verdict(True)
    return Verdict(False, 10)
