"""Which worker holds which model loaded, and the hold: a free worker leaves a cold job,
for at most DIFFQ_WARM_HOLD_SECONDS after it was queued, to a busy worker that holds its
model, instead of loading a second copy (docs/fair-share.md).

Each worker process writes the models it holds (`record`) whenever its loaded set
changes, and removes them when it stops (`forget`). Another worker *holds* a model for
the hold when it says so and runs a job whose lease is live: a crashed worker's rows
say nothing once its lease lapses, and an idle holder needs no hold (it takes the job's
message itself, or none is left for it: the claim then takes the job, workers/hold.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import ColumnElement, and_, delete, exists, func, select
from sqlalchemy.orm import Session, aliased

from app.db import clock
from app.db.models import HeldModel, Job
from app.db.types import utcnow
from app.jobs.states import JobStatus


def record(session: Session, owner: str, models: Iterable[str]) -> None:
    """The models `owner` holds loaded now (replacing what it said before)."""
    session.execute(delete(HeldModel).where(HeldModel.owner == owner))
    now = utcnow()
    session.add_all(HeldModel(owner=owner, model=name, loaded_at=now) for name in set(models))


def forget(session: Session, owner: str) -> None:
    session.execute(delete(HeldModel).where(HeldModel.owner == owner))


def held_by_others(session: Session, owner: str, mine: Iterable[str], seconds: float):
    """SQL for the jobs held for another worker: queued less than `seconds` ago, of a
    model this worker (`owner`, holding `mine`) does not hold and another worker holds
    while it runs a job with a live lease. None: the hold is off. Times are compared on
    the clock they were written on, the database's (app/db/clock.py)."""
    if seconds <= 0:
        return None
    now = clock.now(session)
    running = aliased(Job)
    busy_holder = exists(
        select(HeldModel.owner)
        .join(running, running.lease_owner == HeldModel.owner)
        .where(
            HeldModel.model == Job.model,
            HeldModel.owner != owner,
            running.status == JobStatus.RUNNING,
            running.lease_expires_at > now,
        )
    )
    # A message can arrive before its publish is recorded: then the job's age counts
    # from its creation.
    queued_at = func.coalesce(Job.published_at, Job.created_at)
    return and_(
        Job.model.not_in(list(mine)),
        queued_at > now - timedelta(seconds=seconds),
        busy_holder,
    )


def is_held(session: Session, condition: ColumnElement[bool], job_id) -> bool:
    return session.scalar(select(exists().where(Job.id == job_id, condition))) or False


def any_held(session: Session, waiting: ColumnElement[bool], condition: ColumnElement[bool]):
    return session.scalar(select(exists().where(waiting, condition))) or False
