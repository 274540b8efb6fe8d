"""What the API counts, shared by every API process: requests per key, failed
authentications per address, spent WebSocket tickets, submits in progress, and GPU
time per tenant and day."""

from __future__ import annotations

import uuid
from datetime import date, datetime

from sqlalchemy import (
    BigInteger,
    Date,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Uuid,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base
from app.db.types import UTCDateTime


class AuthFailure(Base):
    """Failed authentications of one client address in one minute, counted by every API
    process (app/web/throttle.py): the failed-auth throttle is shared, as the rate limit
    is. Rows of past minutes are dropped as a new minute's first failure is counted."""

    __tablename__ = "auth_failures"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    window: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # epoch minute
    count: Mapped[int] = mapped_column(Integer, default=0)


class RequestCount(Base):
    """Requests per API key per fixed window: a rate limit every API process shares."""

    __tablename__ = "request_counts"

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    window_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0)


class UsedTicket(Base):
    """A WebSocket ticket already spent (app/web/tickets.py): a ticket opens one socket,
    on whichever API process it is presented. Kept until the ticket expires."""

    __tablename__ = "used_tickets"
    __table_args__ = (Index("ix_used_tickets_expires_at", "expires_at"),)

    ticket_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SubmitReservation(Base):
    """A submit in progress: a slot under its tenant's queued cap, taken in a short
    transaction before the job's own and released by the job's commit. One older than
    RESERVATION_SECONDS (app/limits.py) belonged to a submit that died, and counts no
    more."""

    __tablename__ = "submit_reservations"
    __table_args__ = (
        Index("ix_submit_reservations_tenant_id_created_at", "tenant_id", "created_at"),
    )

    job_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DailyUsage(Base):
    """GPU time, jobs and images per tenant, UTC day, model and device: what usage and
    quotas read. Kept apart from jobs, so that purging old jobs keeps the accounts."""

    __tablename__ = "daily_usage"

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    model: Mapped[str] = mapped_column(String(100), primary_key=True)
    device: Mapped[str] = mapped_column(String(100), primary_key=True)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    jobs: Mapped[int] = mapped_column(Integer, default=0)
    images: Mapped[int] = mapped_column(Integer, default=0)
