"""How many GPUs each model pool's demand will keep busy in the next few minutes: what
the GPU workers scale on before a burst arrives, beside the backlog they scale on after.

The method, in ten lines:

1. Count the jobs that arrived in each minute, per queue (from the jobs' time-ordered ids).
2. The same minutes of the week, 1 to 4 weeks ago, are the seasonal history (with less
   than a week of history: the same minutes of the day, 1 to 7 days ago; with less than
   a day: none, and the forecast is today's last `span` minutes).
3. Seasonal rate of a future slice = the mean, over those weeks (days), of the jobs that
   arrived in the same slice then.
4. Level = jobs of the last `level` minutes against their own seasonal count (this week
   busier or quieter than usual), clamped to 0.5-2; 1 where the history had none.
5. Forecast = level x the busiest `span`-minute slice that starts within the next
   `lookahead` minutes, in jobs a minute.
6. x the pool's mean GPU-seconds a job (its successes of the last week) / 60 = GPUs.

The busiest slice ahead, not the mean over the window: a burst that starts in 8 minutes
is asked for now, and a node that takes 3 minutes to arrive is there when it starts.
`bench/capacity_forecast.py` simulates a week of history and a day with a morning burst,
reactive-only against this (docs/deploy.md, "Capacity before the burst").
"""

from __future__ import annotations

import statistics
import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import and_, func, or_, select

from app.db.models.jobs import Job
from app.db.session import Database
from app.db.types import utcnow
from app.jobs.states import JobStatus

RECENT = 200  # successes a job's mean GPU-seconds is taken over
WEEK = 7 * 24 * 60  # minutes
DAY = 24 * 60


@dataclass(frozen=True)
class Horizon:
    """Minutes: how far ahead a slice may start, how long it is, and the level's span."""

    lookahead: int = 10
    span: int = 5
    level: int = 30


def lags(history_minutes: int) -> list[int]:
    """The seasonal lags (minutes back) that history of this length covers."""
    if history_minutes >= WEEK:
        return [k * WEEK for k in range(1, min(4, history_minutes // WEEK) + 1)]
    if history_minutes >= DAY:
        return [k * DAY for k in range(1, min(7, history_minutes // DAY) + 1)]
    return []


def forecast_rate(
    counts: Mapping[int, float], now: int, lag_list: list[int], horizon: Horizon = Horizon()
) -> float:
    """Jobs a minute expected in the busiest `span` minutes starting within `lookahead`.
    `counts`: jobs that arrived, by epoch minute; `now`: the current epoch minute."""

    def total(start: int, minutes: int) -> float:
        return sum(counts.get(m, 0.0) for m in range(start, start + minutes))

    if not lag_list:
        return total(now - horizon.span, horizon.span) / horizon.span

    def seasonal(start: int, minutes: int) -> float:
        return statistics.fmean(total(start - lag, minutes) for lag in lag_list)

    usual = seasonal(now - horizon.level, horizon.level)
    recent = total(now - horizon.level, horizon.level)
    level = min(2.0, max(0.5, recent / usual)) if usual > 0 else 1.0
    busiest = max(seasonal(now + offset, horizon.span) for offset in range(horizon.lookahead + 1))
    return level * busiest / horizon.span


def _id_floor(minute: int) -> uuid.UUID:
    """The smallest time-ordered id (app/ids.py, UUIDv7) of an epoch minute."""
    return uuid.UUID(int=((minute * 60_000) << 80) | (0x7 << 76))


def _minute_of(job_id: uuid.UUID) -> int:
    return (job_id.int >> 80) // 60_000


def forecast_gpus(
    db: Database, queues: list[str], horizon: Horizon = Horizon()
) -> dict[str, float]:
    """GPUs each queue's demand is expected to keep busy; a queue with no finished job
    yet (no history, no GPU-seconds a job) is absent.

    Per queue, two reads on the (queue, finished_at) index: its first finished job (how
    much history there is) and the GPU-seconds of its latest RECENT successes. Then the
    ids of the jobs in the minutes the forecast needs (the last `level` minutes, and for
    each lag the same minutes then, through `lookahead` + `span` ahead), on the primary
    key's order: no scan of the table."""
    now_dt = utcnow()
    now = int(now_dt.timestamp() // 60)
    lag_of: dict[str, list[int]] = {}
    seconds: dict[str, float] = {}
    with db.session() as session:
        for queue in queues:
            first = session.scalar(
                select(func.min(Job.finished_at)).where(
                    Job.queue == queue, Job.finished_at.is_not(None)
                )
            )
            recent = session.scalars(
                select(Job.gpu_seconds)
                .where(
                    Job.queue == queue,
                    Job.finished_at.is_not(None),
                    Job.status == JobStatus.SUCCEEDED,
                    Job.gpu_seconds.is_not(None),
                )
                .order_by(Job.finished_at.desc())
                .limit(RECENT)
            ).all()
            if first is None or not recent:
                continue
            seconds[queue] = statistics.fmean(recent)
            lag_of[queue] = lags(int((now_dt - _aware(first)).total_seconds() // 60))
        if not seconds:
            return {}
        ahead = horizon.lookahead + horizon.span
        spans = {(now - horizon.level, now + 1)}
        for lag in {lag for found in lag_of.values() for lag in found}:
            spans.add((now - lag - horizon.level, now - lag + ahead))
        ids = session.execute(
            select(Job.queue, Job.id).where(
                Job.queue.in_(list(seconds)),
                or_(*(and_(Job.id >= _id_floor(a), Job.id < _id_floor(b)) for a, b in spans)),
            )
        ).all()
    counts: dict[str, Counter] = defaultdict(Counter)
    for queue, job_id in ids:
        counts[queue][_minute_of(job_id)] += 1
    return {
        q: forecast_rate(counts[q], now, lag_of[q], horizon) * seconds[q] / 60.0 for q in seconds
    }


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)
