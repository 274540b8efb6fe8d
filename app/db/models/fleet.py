"""What operators and workers say about models: pauses, which worker holds which model
loaded, and the digest of each model's weights."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    String,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base
from app.db.types import UTCDateTime, utcnow


class ModelPause(Base):
    """A model an operator paused (app/jobs/pauses.py): its workers stop taking its jobs
    until it is resumed; its queued jobs wait."""

    __tablename__ = "model_pauses"

    model: Mapped[str] = mapped_column(String(100), primary_key=True)
    paused_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Its running jobs were asked to checkpoint and go back to the queue (`--now`).
    now: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    reason: Mapped[str | None] = mapped_column(String(200))
    paused_by: Mapped[str | None] = mapped_column(String(100))


class HeldModel(Base):
    """A model a worker process holds loaded, as it last said (workers/models.py): a free
    worker leaves a cold job to the worker that holds its model, waiting for a busy one
    or handing the message over to an idle one (app/jobs/residency.py). Written when a
    worker's loaded set changes, its `seen_at` renewed every few seconds while the
    process lives; removed when it stops."""

    __tablename__ = "held_models"

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)  # jobs.lease_owner
    model: Mapped[str] = mapped_column(String(100), primary_key=True, index=True)
    loaded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ModelDigest(Base):
    """The SHA-256 of a model's weight files, as the workers that loaded it computed."""

    __tablename__ = "model_digests"

    model: Mapped[str] = mapped_column(String(100), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
