"""Weighted fair share between tenants of a model pool, decided where a job starts.

Every queued job keeps its own durable message on its pool's queue, in priority order.
A message is a permit to start one job of its pool: the worker that receives it starts,
among the queued jobs of the message's priority, the oldest job of the tenant that used
the least GPU time in the last `window` seconds, divided by its weight (ties: the
message's own job). When that is another tenant's job, the message's own job stays
queued and the other job's message, still in the queue, becomes its permit: the count
of messages never falls below the count of queued jobs, so nothing waits without one.
The run records which message started it (`permit_id`), so that a redelivery of that
message (its worker died) takes the run over, as it would its own job.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.orm import Session

from app.db.models import Job, Tenant
from app.jobs.states import JobStatus


@dataclass(frozen=True)
class Share:
    tenant_id: uuid.UUID
    weight: float
    used: float  # GPU-seconds in the window: finished jobs' and running jobs' so far

    @property
    def load(self) -> float:
        return self.used / self.weight


def _waiting(queue: str, priority: int, now: datetime):
    """Queued jobs of the pool at this priority that hold a confirmed message and may
    still start (not past their deadline)."""
    return and_(
        Job.queue == queue,
        Job.status == JobStatus.QUEUED,
        Job.publish_priority == priority,
        Job.published_at.is_not(None),
        or_(Job.deadline_at.is_(None), Job.deadline_at > now),
    )


def shares(
    session: Session, queue: str, tenants: list[uuid.UUID], now: datetime, window: float
) -> dict[uuid.UUID, Share]:
    since = now - timedelta(seconds=window)
    used: dict[uuid.UUID, float] = dict.fromkeys(tenants, 0.0)
    finished = session.execute(
        select(Job.tenant_id, func.sum(Job.gpu_seconds))
        .where(Job.queue == queue, Job.finished_at >= since, Job.tenant_id.in_(tenants))
        .group_by(Job.tenant_id)
    )
    for tenant_id, seconds in finished:
        used[tenant_id] += float(seconds or 0.0)
    running = session.execute(
        select(Job.tenant_id, Job.started_at).where(
            Job.queue == queue, Job.status == JobStatus.RUNNING, Job.tenant_id.in_(tenants)
        )
    )
    for tenant_id, started in running:
        if started is not None:
            used[tenant_id] += max(0.0, (now - max(started, since)).total_seconds())
    weights = dict(
        session.execute(select(Tenant.id, Tenant.weight).where(Tenant.id.in_(tenants))).all()
    )
    return {t: Share(t, max(1e-6, float(weights.get(t) or 1.0)), used[t]) for t in tenants}


def fairest(
    session: Session,
    queue: str,
    priority: int,
    now: datetime,
    window: float,
    prefer: uuid.UUID | None = None,
    where: ColumnElement[bool] | None = None,
) -> Job | None:
    """The oldest waiting job (at `priority`) of the tenant with the least weighted recent
    GPU time; ties go to the `prefer` tenant, then to the oldest job. `where` narrows the
    waiting jobs (a batch: those that may share its pipeline call, workers/batch.py)."""
    rank = func.row_number().over(partition_by=Job.tenant_id, order_by=Job.id).label("rank")
    condition = _waiting(queue, priority, now)
    if where is not None:
        condition = and_(condition, where)
    waiting = select(Job.tenant_id, Job.id, rank).where(condition).subquery()
    heads = dict(
        session.execute(select(waiting.c.tenant_id, waiting.c.id).where(waiting.c.rank == 1)).all()
    )
    if not heads:
        return None
    loads = shares(session, queue, list(heads), now, window)
    best = min(
        loads.values(),
        key=lambda share: (share.load, share.tenant_id != prefer, heads[share.tenant_id]),
    )
    return session.get(Job, heads[best.tenant_id])


def choose(session: Session, job: Job, now: datetime, window: float) -> uuid.UUID | None:
    """The job that the message of `job` should start.

    The oldest waiting job, at the message's priority, of the tenant with the smallest
    weighted share of the pool's recent GPU time (ties: the message's own tenant): its
    own job when it is its tenant's oldest, so a single tenant's jobs start in order.
    When its own job already ran on another job's message, the message is that job's
    permit: it starts the fairest waiting job, or nothing (None) when none waits.
    """
    if job.status == JobStatus.QUEUED and job.published_at is not None:
        best = fairest(session, job.queue, job.publish_priority, now, window, job.tenant_id)
        return job.id if best is None else best.id
    if job.permit_id is not None:
        best = fairest(session, job.queue, job.publish_priority, now, window)
        return best.id if best is not None else None
    return job.id


def position(session: Session, job: Job, now: datetime, window: float) -> tuple[int, int]:
    """(jobs that start before this one, their work units) under fair share.

    Every job of a higher priority goes first. Within the job's priority, tenants take
    turns in proportion to their weights: when k of its tenant's jobs wait ahead of this
    one, another tenant of weight w' gets about k·w'/w of its waiting jobs in first, and
    one more if it has used less GPU time lately (it takes the first turn).
    """
    higher = session.execute(
        select(func.count(), func.coalesce(func.sum(Job.work_units), 0)).where(
            Job.queue == job.queue,
            Job.status == JobStatus.QUEUED,
            Job.publish_priority > job.publish_priority,
        )
    ).one()
    same = and_(
        Job.queue == job.queue,
        Job.status == JobStatus.QUEUED,
        Job.publish_priority == job.publish_priority,
    )
    rows = session.execute(
        select(Job.tenant_id, Tenant.weight, func.count(), func.avg(Job.work_units))
        .join(Tenant, Tenant.id == Job.tenant_id)
        .where(same, or_(Job.tenant_id != job.tenant_id, Job.id < job.id))
        .group_by(Job.tenant_id, Tenant.weight)
    ).all()
    mine = next((r for r in rows if r[0] == job.tenant_id), None)
    my_weight = float(
        session.scalar(select(Tenant.weight).where(Tenant.id == job.tenant_id)) or 1.0
    )
    ahead_mine = int(mine[2]) if mine else 0
    count, units = int(higher[0]), int(higher[1])
    count += ahead_mine
    units += round(ahead_mine * float(mine[3])) if mine else 0
    others = [r[0] for r in rows if r[0] != job.tenant_id]
    loads = shares(session, job.queue, [job.tenant_id, *others], now, window)
    my_load = loads[job.tenant_id].load
    for tenant_id, weight, waiting, avg_units in rows:
        if tenant_id == job.tenant_id:
            continue
        turns = ahead_mine * float(weight or 1.0) / my_weight
        first = min(int(waiting), int(turns) + (1 if loads[tenant_id].load < my_load else 0))
        count += first
        units += round(first * float(avg_units or 1))
    return count, units
