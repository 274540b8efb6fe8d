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

Warmth (`Warmth`): a worker that holds some jobs' weights (their model loaded with their
adapters loaded in its pipeline; failing that, their adapters in memory; failing that,
their model) may start such a job instead of a colder fair choice, within two bounds:
the warm job's tenant is at most `share_slack` weighted GPU-seconds ahead of the
fairest, and the fair choice is passed over at most `max_skips` times (counted on its
row), after which it starts on the next message of its priority. Priority is never
bent: warmth chooses only among jobs of the message's priority.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, false, func, not_, or_, select, update
from sqlalchemy.orm import Session

from app.db.models.jobs import Job
from app.db.models.tenants import Tenant
from app.jobs.states import JobStatus


@dataclass(frozen=True)
class Share:
    tenant_id: uuid.UUID
    weight: float
    used: float  # GPU-seconds in the window: finished jobs' and running jobs' so far

    @property
    def load(self) -> float:
        return self.used / self.weight


def waiting_at(queue: str, priority: int, now: datetime):
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


@dataclass(frozen=True)
class Warmth:
    """What a worker holds warm, and how far that may bend the fair choice."""

    models: tuple[str, ...]  # models loaded
    adapter_sets: tuple[str, ...]  # adapter sets whose adapters it holds in memory ("" too)
    max_skips: int  # times a cold fair choice may be passed over (0: warmth ignored)
    share_slack: float  # weighted GPU-seconds the warm tenant may be ahead
    # (model, adapter set) whose adapters are loaded in that model's pipeline ("" too)
    loaded: tuple[tuple[str, str], ...] = ()

    def level(self, job: Job) -> int:
        """3: its model loaded with its adapters in the pipeline; 2: its model loaded and
        its adapters in memory; 1: its model only; 0: not even its model."""
        if job.model not in self.models:
            return 0
        if (job.model, job.adapter_set or "") in self.loaded:
            return 3
        return 2 if (job.adapter_set or "") in self.adapter_sets else 1

    def tiers(self, above: int) -> list[ColumnElement[bool]]:
        """SQL for the jobs warmer than `above`, warmest first."""
        model = Job.model.in_(self.models)
        by_model: dict[str, list[str]] = {}
        for name, adapter_set in self.loaded:
            by_model.setdefault(name, []).append(adapter_set)
        in_pipeline = or_(
            false(),
            *(and_(Job.model == m, Job.adapter_set.in_(sets)) for m, sets in by_model.items()),
        )
        tiers = [in_pipeline, and_(model, Job.adapter_set.in_(self.adapter_sets)), model]
        return tiers[: 3 - above]


def _heads(session: Session, condition: ColumnElement[bool]) -> dict[uuid.UUID, uuid.UUID]:
    """Each tenant's oldest job among those `condition` selects."""
    rank = func.row_number().over(partition_by=Job.tenant_id, order_by=Job.id).label("rank")
    waiting = select(Job.tenant_id, Job.id, rank).where(condition).subquery()
    return dict(
        session.execute(select(waiting.c.tenant_id, waiting.c.id).where(waiting.c.rank == 1)).all()
    )


def fairest(
    session: Session,
    queue: str,
    priority: int,
    now: datetime,
    window: float,
    prefer: uuid.UUID | None = None,
    where: ColumnElement[bool] | None = None,
    warmth: Warmth | None = None,
) -> Job | None:
    """The oldest waiting job (at `priority`) of the tenant with the least weighted recent
    GPU time; ties go to the `prefer` tenant, then to the oldest job. `where` narrows the
    waiting jobs (a batch: those that may share its pipeline call, workers/batch.py).
    With `warmth`, a warm job may go first within its bounds (`Warmth`)."""
    condition = waiting_at(queue, priority, now)
    if where is not None:
        condition = and_(condition, where)
    heads = _heads(session, condition)
    if not heads:
        return None
    loads = shares(session, queue, list(heads), now, window)
    best = min(
        loads.values(),
        key=lambda share: (share.load, share.tenant_id != prefer, heads[share.tenant_id]),
    )
    chosen = session.get(Job, heads[best.tenant_id])
    if warmth is None or warmth.max_skips <= 0 or chosen is None:
        return chosen
    if chosen.warm_skips >= warmth.max_skips:
        return chosen  # passed over enough: it starts now, warm or not
    for tier in warmth.tiers(above=warmth.level(chosen)):  # its weights held, then its model
        warm_heads = _heads(session, and_(condition, tier))
        if not warm_heads:
            continue
        warm_loads = shares(session, queue, list(warm_heads), now, window)
        near = [s for s in warm_loads.values() if s.load <= best.load + warmth.share_slack]
        if not near:
            continue
        pick = min(near, key=lambda share: (share.load, warm_heads[share.tenant_id]))
        # Counted where the claim commits: a claim that loses its race still counts,
        # which only shortens the cold job's wait.
        session.execute(
            update(Job)
            .where(Job.id == chosen.id, Job.status == JobStatus.QUEUED)
            .values(warm_skips=Job.warm_skips + 1)
        )
        return session.get(Job, warm_heads[pick.tenant_id])
    return chosen


def choose(
    session: Session,
    job: Job,
    now: datetime,
    window: float,
    warmth: Warmth | None = None,
    passing: Collection[uuid.UUID] = (),
    leave: ColumnElement[bool] | None = None,
) -> uuid.UUID | None:
    """The job that the message of `job` should start.

    The oldest waiting job, at the message's priority, of the tenant with the smallest
    weighted share of the pool's recent GPU time (ties: the message's own tenant): its
    own job when it is its tenant's oldest, so a single tenant's jobs start in order.
    When its own job already ran on another job's message, the message is that job's
    permit: it starts the fairest waiting job, or nothing (None) when none waits.
    `passing`: jobs to leave out of this choice (another worker is claiming them:
    workers/claim.py); with every other job passed, a queued job's message chooses its own.
    `leave`: SQL for more jobs to leave out (held for a warm worker: workers/hold.py).
    """
    left = [Job.id.not_in(list(passing))] if passing else []
    if leave is not None:
        left.append(not_(leave))
    where = and_(*left) if left else None
    queue, priority = job.queue, job.publish_priority
    if job.status == JobStatus.QUEUED and job.published_at is not None:
        best = fairest(session, queue, priority, now, window, job.tenant_id, where, warmth)
        return job.id if best is None else best.id
    if job.permit_id is not None:
        best = fairest(session, queue, priority, now, window, where=where, warmth=warmth)
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
