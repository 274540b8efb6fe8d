"""Batches and the Files API's files."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    Uuid,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, partial_index
from app.db.types import JSONType, UTCDateTime, utcnow
from app.ids import uuid7


class Batch(Base):
    """Many jobs submitted as one (POST /v1/batches): one status with counts, one cancel,
    one completion webhook, an optional completion window and result files. Its jobs are
    ordinary jobs carrying `batch_id` and their line's `custom_id` (app/batches)."""

    __tablename__ = "batches"
    __table_args__ = (
        Index("ix_batches_tenant_id_id", "tenant_id", "id"),
        Index("uq_batches_tenant_id_idempotency_key", "tenant_id", "idempotency_key", unique=True),
        # The relay's scan: batches not ended yet.
        partial_index("ix_batches_open", "id", where="finished_at IS NULL"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    # validating (lines being stored) -> in_progress -> completed | expired;
    # cancelling -> cancelled | failed. "finalizing" is shown, not stored (app/batches).
    status: Mapped[str] = mapped_column(String(16))
    # What each line is: "/v1/jobs" (a job request) or an OpenAI endpoint's request.
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    completion_window: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    in_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Past it, the batch's jobs not started yet end canceled/expired.
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancelling_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finalizing_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    total: Mapped[int] = mapped_column(Integer)  # lines, refused ones included
    invalid: Mapped[int] = mapped_column(Integer, default=0)  # refused lines (no job)
    expired: Mapped[int] = mapped_column(Integer, default=0)  # jobs ended by the window
    # Counts per outcome, frozen when the batch ended (read from its jobs before).
    counts: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    output_file_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    error_file_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    # Why the batch failed: OpenAI's {"object": "list", "data": [{code, message, line}]}.
    errors: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # Lines refused one by one (an OpenAI input file's): [{line, custom_id, status, error}].
    invalid_lines: Mapped[list[Any] | None] = mapped_column(JSONType, deferred=True)
    # custom_ids of OpenAI lines that asked for `response_format: b64_json`.
    b64_json: Mapped[list[str] | None] = mapped_column(JSONType, deferred=True)
    client_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONType)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))


class BatchFile(Base):
    """A file of the Files API: a batch's input a tenant uploaded (kept in the result
    store), or a batch's output or error file (rendered from its jobs when read)."""

    __tablename__ = "files"
    __table_args__ = (Index("ix_files_tenant_id_id", "tenant_id", "id"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    purpose: Mapped[str] = mapped_column(String(32))  # batch | batch_output | batch_error
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    storage_key: Mapped[str | None] = mapped_column(Text)  # an upload's object
    batch_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)  # an output's batch
