"""Tenants and their API keys."""

from __future__ import annotations

import base64
import secrets
import uuid
from datetime import datetime

from sqlalchemy import (
    Boolean,
    Float,
    ForeignKey,
    String,
    Uuid,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.db.base import Base
from app.db.types import UTCDateTime, utcnow
from app.ids import uuid7


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Standard Webhooks signing secret ("whsec_<base64>"); after a rotation the previous
    # one keeps signing too until `webhook_secret_previous_until`.
    webhook_secret: Mapped[str | None] = mapped_column(String(80), default=new_webhook_secret)
    webhook_secret_previous: Mapped[str | None] = mapped_column(String(80))
    webhook_secret_previous_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Fair share: a tenant with weight 2 gets twice the GPU time of one with weight 1
    # when both have jobs waiting on the same model pool.
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default=text("1"))
    # Quota: GPU-seconds a day (UTC); None means no quota.
    daily_gpu_seconds: Mapped[float | None] = mapped_column(Float)

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
    # An operator's key may also pause and resume models (`PUT /v1/models/{model}/pause`).
    operator: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    tenant: Mapped[Tenant] = relationship(back_populates="keys")
