"""The webhook outbox: one event per job or batch change, and each attempt to deliver it."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ForeignKey,
    Index,
    Integer,
    String,
    Uuid,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, partial_index
from app.db.types import JSONType, UTCDateTime, utcnow
from app.ids import uuid7


class WebhookEvent(Base):
    """One event for one job's webhook: the delivery outbox. Its id is the stable
    `webhook-id` of every attempt to deliver it."""

    __tablename__ = "webhook_events"
    __table_args__ = (
        partial_index("ix_webhook_events_due", "next_attempt_at", where="state = 'pending'"),
        Index("ix_webhook_events_job_id_created_at", "job_id", "created_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    # A job's event, or (job_id null) a batch's (`batch.completed`, …).
    job_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    batch_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("batches.id", ondelete="CASCADE"), index=True
    )
    type: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The body, frozen at the first attempt so that every retry sends the same bytes.
    payload: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # pending -> delivered | failed (schedule exhausted) | gone (receiver answered 410)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Handed to a delivery worker until then; past it, the relay hands it out again.
    dispatched_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class WebhookAttempt(Base):
    """One HTTP attempt to deliver an event, as it went."""

    __tablename__ = "webhook_attempts"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    event_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("webhook_events.id", ondelete="CASCADE"), index=True
    )
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    status_code: Mapped[int | None] = mapped_column(Integer)
    latency_ms: Mapped[int | None] = mapped_column(Integer)
    # Why it did not count as delivered (refused address, timeout, status, redirect).
    error: Mapped[str | None] = mapped_column(String(300))
