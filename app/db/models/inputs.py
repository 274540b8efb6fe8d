"""What tenants store for their jobs to name: input images and LoRA adapters."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
    Uuid,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base
from app.db.types import UTCDateTime, utcnow
from app.ids import uuid7


class Upload(Base):
    """An input image a tenant stored (`POST /v1/uploads`, or a `data:` URI in a job),
    decoded and checked at upload and kept as PNG under the tenant's prefix, addressed by
    the SHA-256 of that PNG: the same image uploaded twice is one object and one row (its
    expiry moved on). Jobs name its digest; the object stays while an unexpired upload
    or a job whose results are kept names it (app/housekeeping/retention.py)."""

    __tablename__ = "uploads"
    __table_args__ = (
        UniqueConstraint("tenant_id", "sha256", name="uq_uploads_tenant_id_sha256"),
        Index("ix_uploads_expires_at", "expires_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    sha256: Mapped[str] = mapped_column(String(64))
    width: Mapped[int] = mapped_column(Integer)
    height: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(Integer)
    # The stored PNG's mode: RGB, RGBA (the upload had transparency) or L (a mask).
    mode: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class Adapter(Base):
    """A LoRA adapter a tenant stored (`POST /v1/adapters`), checked at upload for its
    base model's family (app/addons/lora/checks.py) and kept as safetensors under the tenant's
    prefix, addressed by its SHA-256. Jobs name it by id; their request keeps the digest."""

    __tablename__ = "adapters"
    __table_args__ = (UniqueConstraint("tenant_id", "sha256", name="uq_adapters_tenant_id_sha256"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    sha256: Mapped[str] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(200))
    # The model it was checked for, and that model's family (app/addons/lora/checks.py FAMILIES).
    model: Mapped[str] = mapped_column(String(100))
    family: Mapped[str] = mapped_column(String(40))
    bytes: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    layers: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
