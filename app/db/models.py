"""Tables: tenants, their API keys, and jobs (which double as their own publish outbox)."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Enum, ForeignKey, Index, Integer, SmallInteger, String, Text, Uuid, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.db.base import Base
from app.db.types import JSONType, UTCDateTime, utcnow
from app.ids import uuid7
from app.jobs.states import JobStatus, Priority


def _enum(cls: type[StrEnum], name: str) -> Enum:
    """Enums stored by value in a VARCHAR with a CHECK (no PostgreSQL enum type to drop)."""
    return Enum(
        cls,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=16,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    keys: Mapped[list[ApiKey]] = relationship(back_populates="tenant")


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    # The public half of the key ("dq_<key_id>_<secret>"), used to find the row.
    key_id: Mapped[str] = mapped_column(String(32), unique=True)
    # SHA-256 of the whole key, hex; the key itself is shown once and never stored.
    secret_hash: Mapped[str] = mapped_column(String(64))
    label: Mapped[str | None] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    tenant: Mapped[Tenant] = relationship(back_populates="keys")


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # Newest-first listing per tenant, with and without a status filter.
        Index("ix_jobs_tenant_id_id", "tenant_id", "id"),
        Index("ix_jobs_tenant_id_status_id", "tenant_id", "status", "id"),
        # Queue position: queued jobs of a queue in delivery order.
        Index(
            "ix_jobs_queued_order",
            "queue",
            "publish_priority",
            "id",
            postgresql_where=text("status = 'queued'"),
            sqlite_where=text("status = 'queued'"),
        ),
        Index(
            "ix_jobs_running",
            "queue",
            postgresql_where=text("status = 'running'"),
            sqlite_where=text("status = 'running'"),
        ),
        # Recent successes of a model: the queue-time estimate's history.
        Index(
            "ix_jobs_model_finished",
            "model",
            "finished_at",
            postgresql_where=text("status = 'succeeded'"),
            sqlite_where=text("status = 'succeeded'"),
        ),
        # One job per (tenant, Idempotency-Key).
        Index("uq_jobs_tenant_id_idempotency_key", "tenant_id", "idempotency_key", unique=True),
        # The relay's scan for rows whose publish did not happen.
        Index(
            "ix_jobs_unpublished",
            "created_at",
            postgresql_where=text("published_at IS NULL AND status = 'queued'"),
            sqlite_where=text("published_at IS NULL AND status = 'queued'"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    status: Mapped[JobStatus] = mapped_column(
        _enum(JobStatus, "job_status"), default=JobStatus.QUEUED
    )
    model: Mapped[str] = mapped_column(String(100))
    queue: Mapped[str] = mapped_column(String(200))
    priority: Mapped[Priority] = mapped_column(
        _enum(Priority, "job_priority"), default=Priority.NORMAL
    )
    # AMQP priority of the newest message for this job (aging raises it; see relay).
    publish_priority: Mapped[int] = mapped_column(SmallInteger, default=5, server_default=text("5"))
    # The normalized request, including the seed actually used.
    input: Mapped[dict[str, Any]] = mapped_column(JSONType)
    # steps x images: what the queue-time estimate charges for this job.
    work_units: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    client_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONType)
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Bumped by every change; the id of Server-Sent Events (Last-Event-ID).
    version: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    error_code: Mapped[str | None] = mapped_column(String(40))
    error_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Not started by then: canceled with reason "deadline" (the request's cancel_after).
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    # SHA-256 of the request body that first used the key.
    request_hash: Mapped[str | None] = mapped_column(String(64))
    # Outbox: NULL until the task message was confirmed by the broker.
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Who runs it and until when that claim holds without renewal.
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
