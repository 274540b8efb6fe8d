"""A tenant's LoRA adapters: each file stored once per digest under the tenant's prefix
(`<tenant>/adapters/<sha256>.safetensors`) and recorded in `adapters` (its rank, layers
and family, checked at upload: checks.py). A deleted one is found by no job and no read,
as one that never was."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.addons.lora.checks import CheckedAdapter
from app.db.models.inputs import Adapter
from app.db.types import utcnow
from app.storage import Storage


def adapter_key(tenant_id: object, sha256: str) -> str:
    return f"{tenant_id}/adapters/{sha256}.safetensors"


def store(
    session: Session,
    storage: Storage,
    tenant_id: uuid.UUID,
    adapter: CheckedAdapter,
    *,
    name: str | None,
    model: str,
) -> Adapter:
    """Put the file under the tenant's prefix (once per digest) and record it: a new row,
    or the same file's row (named anew, undeleted). Commits."""
    storage.put(adapter_key(tenant_id, adapter.sha256), adapter.data, "application/octet-stream")
    row = session.scalar(
        select(Adapter).where(Adapter.tenant_id == tenant_id, Adapter.sha256 == adapter.sha256)
    )
    if row is None:
        row = Adapter(
            tenant_id=tenant_id,
            sha256=adapter.sha256,
            bytes=len(adapter.data),
            rank=adapter.rank,
            layers=adapter.pairs,
            family=adapter.family,
            model=model,
            created_at=utcnow(),
        )
        session.add(row)
    row.name = name
    row.deleted_at = None
    session.commit()
    return row


def find(session: Session, tenant_id: uuid.UUID, adapter_id: uuid.UUID) -> Adapter | None:
    """The tenant's adapter; None for another tenant's or a deleted one, as for none."""
    row = session.scalar(
        select(Adapter).where(Adapter.id == adapter_id, Adapter.tenant_id == tenant_id)
    )
    return None if row is None or row.deleted_at is not None else row


def listing(session: Session, tenant_id: uuid.UUID) -> Sequence[Adapter]:
    return session.scalars(
        select(Adapter)
        .where(Adapter.tenant_id == tenant_id, Adapter.deleted_at.is_(None))
        .order_by(Adapter.id)
    ).all()
