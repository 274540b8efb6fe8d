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

from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import ColumnElement, and_, delete, exists, func, not_, or_, select, update
from sqlalchemy.orm import Session, aliased

from app.db import clock
from app.db.models.fleet import HeldModel
from app.db.models.jobs import Job
from app.db.types import utcnow
from app.jobs.states import JobStatus

# How often a worker says it is alive, and how long after that it counts as gone.
ALIVE_SECONDS = 10.0
LIVE_SECONDS = 30.0
GONE_SECONDS = 86400.0  # rows unseen this long are removed by the next worker's record


def record(session: Session, owner: str, models: Iterable[str]) -> None:
    """The models `owner` holds loaded now (replacing what it said before). Rows of
    workers unseen for a day (they ended without removing theirs: killed, or their host
    lost) go too."""
    now, seen_at = utcnow(), clock.now(session)
    gone = seen_at - timedelta(seconds=GONE_SECONDS)
    session.execute(
        delete(HeldModel).where(or_(HeldModel.owner == owner, HeldModel.seen_at < gone))
    )
    session.add_all(
        HeldModel(owner=owner, model=name, loaded_at=now, seen_at=seen_at) for name in set(models)
    )


def seen(session: Session, owner: str) -> None:
    """`owner` is alive (every ALIVE_SECONDS)."""
    session.execute(
        update(HeldModel).where(HeldModel.owner == owner).values(seen_at=clock.now(session))
    )


def forget(session: Session, owner: str) -> None:
    session.execute(delete(HeldModel).where(HeldModel.owner == owner))


def held_elsewhere(session: Session, owner: str, mine: Iterable[str]) -> list[str]:
    """The models another worker says it holds and this one (holding `mine`) does not."""
    return list(
        session.scalars(
            select(HeldModel.model)
            .where(HeldModel.owner != owner, HeldModel.model.not_in(list(mine)))
            .distinct()
        )
    )


def also_held(session: Session, owner: str, mine: Iterable[str]) -> set[str]:
    """Of `mine`, the models another worker seen alive lately holds too: a second copy,
    the first a worker unloads to make room (workers/models.py), so that the fleet's
    slots hold as many distinct models as they can."""
    alive = clock.now(session) - timedelta(seconds=LIVE_SECONDS)
    return set(
        session.scalars(
            select(HeldModel.model)
            .where(
                HeldModel.owner != owner,
                HeldModel.model.in_(list(mine)),
                HeldModel.seen_at > alive,
            )
            .distinct()
        )
    )


def demand(session: Session, models: Iterable[str], window: float) -> dict[str, tuple[int, int]]:
    """Each of `models`' recent jobs and queued jobs, by name: (the jobs that succeeded
    within the last `window` seconds or run now, the jobs queued now), for the choice of
    which model a worker unloads (workers/unload.py). Succeeded jobs are found through
    ix_jobs_model_finished, the queued and running through their partial indexes."""
    models = list(models)
    if not models:
        return {}
    since = clock.now(session) - timedelta(seconds=window)
    queued = Job.status == JobStatus.QUEUED
    recent = or_(
        Job.status == JobStatus.RUNNING,
        and_(Job.status == JobStatus.SUCCEEDED, Job.finished_at > since),
    )
    rows = session.execute(
        select(
            Job.model,
            func.count().filter(recent),
            func.count().filter(queued),
        )
        .where(Job.model.in_(models), or_(queued, recent))
        .group_by(Job.model)
    )
    return {model: (seen, waiting) for model, seen, waiting in rows}


def held_by_others(session: Session, owner: str, mine: Iterable[str], seconds: float):
    """SQL for the jobs held for another worker: queued less than `seconds` ago, of a
    model this worker (`owner`, holding `mine`) does not hold and another worker holds
    while it runs a job with a live lease. None: nothing to hold (the hold is off, or
    no other worker holds a model this one lacks). Times are compared on the clock they
    were written on, the database's (app/db/clock.py)."""
    if seconds <= 0:
        return None
    models = held_elsewhere(session, owner, mine)
    if not models:
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
    return and_(Job.model.in_(models), queued_at > now - timedelta(seconds=seconds), busy_holder)


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
