"""What tenants used: GPU-seconds, jobs and images per UTC day, model and device; the
daily GPU-second quota; prices.

A job is charged when it succeeds, for the device time inside its pipeline call (not its
queue time, not the upload). The day is the UTC day it finished on.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.db.models.limits import DailyUsage
from app.db.models.tenants import Tenant


@dataclass(frozen=True)
class Charge:
    gpu_seconds: float
    device: str
    images: int


def record(session: Session, tenant_id: uuid.UUID, model: str, charge: Charge, day: date) -> None:
    """Add one finished job to its tenant's day, in the caller's transaction."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    values = {
        "tenant_id": tenant_id,
        "day": day,
        "model": model,
        "device": charge.device,
        "gpu_seconds": charge.gpu_seconds,
        "jobs": 1,
        "images": charge.images,
    }
    insert = dialect.insert(DailyUsage).values(**values)
    session.execute(
        insert.on_conflict_do_update(
            index_elements=["tenant_id", "day", "model", "device"],
            set_={
                "gpu_seconds": DailyUsage.gpu_seconds + insert.excluded.gpu_seconds,
                "jobs": DailyUsage.jobs + 1,
                "images": DailyUsage.images + insert.excluded.images,
            },
        )
    )


def between(session: Session, tenant_id: uuid.UUID, first: date, last: date) -> list[DailyUsage]:
    """The tenant's rows from `first` to `last` (both included), by day, model, device."""
    return list(
        session.scalars(
            select(DailyUsage)
            .where(
                DailyUsage.tenant_id == tenant_id,
                DailyUsage.day >= first,
                DailyUsage.day <= last,
            )
            .order_by(DailyUsage.day, DailyUsage.model, DailyUsage.device)
        )
    )


def used_on(session: Session, tenant_id: uuid.UUID, day: date) -> float:
    return float(
        session.scalar(
            select(func.coalesce(func.sum(DailyUsage.gpu_seconds), 0.0)).where(
                DailyUsage.tenant_id == tenant_id, DailyUsage.day == day
            )
        )
    )


@dataclass(frozen=True)
class QuotaVerdict:
    allowed: bool
    used: float = 0.0
    limit: float | None = None
    retry_after: int = 0  # seconds until the UTC day ends and the quota frees


_tenants, _usage = Tenant.__table__, DailyUsage.__table__
_QUOTA = select(
    _tenants.c.daily_gpu_seconds,
    select(func.coalesce(func.sum(_usage.c.gpu_seconds), 0.0))
    .where(_usage.c.tenant_id == _tenants.c.id, _usage.c.day == bindparam("day"))
    .scalar_subquery(),
).where(_tenants.c.id == bindparam("tenant"))


_USED = select(func.coalesce(func.sum(_usage.c.gpu_seconds), 0.0)).where(
    _usage.c.tenant_id == bindparam("tenant"), _usage.c.day == bindparam("day")
)
_UNKNOWN = object()


def check_daily_quota(
    session: Session, tenant_id: uuid.UUID, now: datetime, limit: Any = _UNKNOWN
) -> QuotaVerdict:
    """Over quota once today's GPU-seconds reach the tenant's daily_gpu_seconds (`limit`,
    read here unless given; None: no quota, nothing to read). Jobs already queued are
    never dropped: the check is made at submit only."""
    today = now.astimezone(UTC).date()
    if limit is _UNKNOWN:
        row = session.execute(_QUOTA, {"tenant": tenant_id, "day": today}).first()
        limit, used = (row[0], row[1]) if row else (None, 0.0)
    elif limit is not None:
        used = session.execute(_USED, {"tenant": tenant_id, "day": today}).scalar_one()
    if limit is None:
        return QuotaVerdict(True)
    used = float(used)
    if used < limit:
        return QuotaVerdict(True, used, limit)
    midnight = datetime.combine(today + timedelta(days=1), time(), tzinfo=UTC)
    return QuotaVerdict(False, used, limit, max(1, int((midnight - now).total_seconds()) + 1))


def price(prices: dict[str, float], device: str, gpu_seconds: float) -> float | None:
    """Money for `gpu_seconds` on `device`, or None where no price is set."""
    rate = prices.get(device, prices.get("*"))
    return None if rate is None else round(rate * gpu_seconds, 6)
