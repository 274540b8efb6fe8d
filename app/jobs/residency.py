"""Which worker holds which model loaded, and the hold: a free worker leaves a cold job
to the worker that holds its model instead of loading a second copy
(docs/fair-share.md, workers/hold.py). A busy holder is waited for, at most
DIFFQ_WARM_HOLD_SECONDS after the job was queued; to an idle one the message is handed
back through the queue.

Each worker process writes the models it holds (`record`) whenever its loaded set
changes, renews `seen_at` every ALIVE_SECONDS (`seen`), and removes its rows when it
stops (`forget`). A *busy* holder says so and runs a job whose lease is live (a crashed
worker's rows say nothing once its lease lapses); an *idle* holder runs none and was
seen within LIVE_SECONDS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta

from sqlalchemy import ColumnElement, and_, delete, exists, func, not_, or_, select, update
from sqlalchemy.orm import Session, aliased

from app.db import clock
from app.db.models import HeldModel, Job
from app.db.types import utcnow
from app.jobs.states import JobStatus

# How often a worker says it is alive, and how long after that it counts as gone.
ALIVE_SECONDS = 10.0
LIVE_SECONDS = 30.0
GONE_SECONDS = 86400.0  # rows unseen this long are removed by the next worker's record


# By default a cold job waits for a busy holder at most this many times the seconds its
# model's load took there (DIFFQ_WARM_HOLD_LOADS): loading a second copy costs a load
# now and, as it unloads another model, about one more later.
HOLD_LOADS = 2.0


def record(session: Session, owner: str, models: Mapping[str, float | None]) -> None:
    """The models `owner` holds loaded now, each with the seconds its load took there
    (replacing what it said before). Rows of workers unseen for a day (they ended without
    removing theirs: killed, or their host lost) go too."""
    now, seen_at = utcnow(), clock.now(session)
    gone = seen_at - timedelta(seconds=GONE_SECONDS)
    session.execute(
        delete(HeldModel).where(or_(HeldModel.owner == owner, HeldModel.seen_at < gone))
    )
    session.add_all(
        HeldModel(owner=owner, model=name, loaded_at=now, seen_at=seen_at, load_seconds=seconds)
        for name, seconds in models.items()
    )


def seen(session: Session, owner: str) -> None:
    """`owner` is alive (every ALIVE_SECONDS)."""
    session.execute(
        update(HeldModel).where(HeldModel.owner == owner).values(seen_at=clock.now(session))
    )


def forget(session: Session, owner: str) -> None:
    session.execute(delete(HeldModel).where(HeldModel.owner == owner))


def bounds(
    session: Session, owner: str, mine: Iterable[str], seconds: float, loads: float = HOLD_LOADS
) -> dict:
    """Model -> seconds its jobs may be held: `seconds`, or `loads` times the longest load
    of it that another worker measured, whichever is less."""
    rows = session.execute(
        select(HeldModel.model, func.max(HeldModel.load_seconds))
        .where(HeldModel.owner != owner, HeldModel.model.not_in(list(mine)))
        .group_by(HeldModel.model)
    )
    return {
        model: seconds if load is None else min(seconds, loads * float(load))
        for model, load in rows
    }


def held_by_others(
    session: Session, owner: str, mine: Iterable[str], seconds: float, loads: float = HOLD_LOADS
):
    """SQL for the jobs held for another worker: of a model this worker (`owner`, holding
    `mine`) does not hold and another worker holds while it runs a job with a live
    lease, queued less than the model's bound ago (`bounds`). None: nothing to hold.
    Times are compared on the clock they were written on, the database's
    (app/db/clock.py)."""
    if seconds <= 0:
        return None
    held = bounds(session, owner, mine, seconds, loads)
    if not held:
        return None
    now = clock.now(session)
    busy_holder = exists(
        select(HeldModel.owner).where(
            HeldModel.model == Job.model, HeldModel.owner != owner, _running(now)
        )
    )
    # A message can arrive before its publish is recorded: then the job's age counts
    # from its creation.
    queued_at = func.coalesce(Job.published_at, Job.created_at)
    recent = or_(
        *(
            and_(Job.model == model, queued_at > now - timedelta(seconds=bound))
            for model, bound in held.items()
        )
    )
    return and_(recent, busy_holder)


def is_held(session: Session, condition: ColumnElement[bool], job_id) -> bool:
    return session.scalar(select(exists().where(Job.id == job_id, condition))) or False


def any_held(session: Session, waiting: ColumnElement[bool], condition: ColumnElement[bool]):
    return session.scalar(select(exists().where(waiting, condition))) or False


def idle_holder(session: Session, owner: str, model: str) -> bool:
    """Whether a worker other than `owner`, seen alive lately, holds `model` and runs
    nothing now."""
    now = clock.now(session)
    alive = now - timedelta(seconds=LIVE_SECONDS)
    return (
        session.scalar(
            select(
                exists().where(
                    HeldModel.model == model,
                    HeldModel.owner != owner,
                    HeldModel.seen_at > alive,
                    not_(_running(now)),
                )
            )
        )
        or False
    )


def _running(now) -> ColumnElement[bool]:
    """The worker of the enclosing `held_models` row runs a job under a live lease."""
    running = aliased(Job)
    return exists(
        select(running.id).where(
            running.lease_owner == HeldModel.owner,
            running.status == JobStatus.RUNNING,
            running.lease_expires_at > now,
        )
    )
