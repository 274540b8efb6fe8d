"""Paused models: an operator stops a model's work without losing a job.

`pause` records the model in `model_pauses`. From then on:

- its workers stop consuming its queues (workers/pausing.py, within DIFFQ_PAUSE_POLL
  seconds); a delivery that comes before goes back to the queue unclaimed;
- its queued jobs wait in order; their positions stay as they were, and their ETAs are
  unknown (null) until it is resumed: no start time can be promised for a paused model;
- its running jobs finish, or, paused `now`, the ones that checkpoint (workers/
  checkpoints.py) save their state at their next step and go back to the queue, to resume
  from that step once it is resumed; a run within DIFFQ_SHUTDOWN_FINISH seconds of its end
  finishes;
- its backlog leaves the scaling metric (app/gauges/backlog.py): no node is brought up
  for work that may not run.

`resume` removes the row: workers consume its queues again and the jobs run in the order
they would have. The unit is the model, and so its queues must be its own: a queue that
also serves a model not being paused would stop that one too, so such a pause is
refused, naming the models to pause together.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.catalog import Catalog
from app.db.models.fleet import ModelPause
from app.db.models.jobs import Job
from app.db.types import utcnow
from app.jobs import transitions

YIELD_PAUSED = "paused"


class PauseRefused(ValueError):
    """An unknown model, or a queue shared with a model not paused with it."""

    def __init__(self, message: str, *, unknown: bool = False) -> None:
        super().__init__(message)
        self.unknown = unknown


@dataclass(frozen=True)
class Pause:
    model: str
    paused_at: datetime
    now: bool
    reason: str | None
    paused_by: str | None

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "paused_at": self.paused_at.isoformat(),
            "now": self.now,
            "reason": self.reason,
            "paused_by": self.paused_by,
        }


def _pause(row: ModelPause) -> Pause:
    return Pause(row.model, row.paused_at, row.now, row.reason, row.paused_by)


def paused(session: Session) -> dict[str, Pause]:
    """Every paused model, by name."""
    return {row.model: _pause(row) for row in session.scalars(select(ModelPause))}


def is_paused(session: Session, model: str) -> bool:
    return session.get(ModelPause, model) is not None


def job_paused(session: Session, job_id) -> bool:
    """Whether the job's model is paused (one read: a delivery's first question)."""
    found = session.scalar(
        select(ModelPause.model).join(Job, Job.model == ModelPause.model).where(Job.id == job_id)
    )
    return found is not None


def paused_queues(catalog: Catalog, models: Iterable[str]) -> set[str]:
    """The queues whose every model is paused: no worker consumes them."""
    models = set(models)
    return {
        queue
        for queue in catalog.queues
        if all(m.name in models for m in catalog.models.values() if queue in m.all_queues)
    }


def check(catalog: Catalog, models: Iterable[str], alike: Iterable[str], verb: str) -> None:
    """Refuse unknown models, and a queue of theirs that serves a model left as it is
    (`alike`: the models already in the state asked for)."""
    models = list(models)
    unknown = [m for m in models if m not in catalog.models]
    if unknown:
        known = ", ".join(sorted(catalog.models))
        raise PauseRefused(f"unknown model(s) {', '.join(unknown)}; known: {known}", unknown=True)
    together = set(models) | set(alike)
    for name in models:
        for queue in catalog.models[name].all_queues:
            others = sorted(
                m.name
                for m in catalog.models.values()
                if queue in m.all_queues and m.name not in together
            )
            if others:
                raise PauseRefused(
                    f"model {name}'s queue {queue} also serves {', '.join(others)}: "
                    f"{verb} them together ({', '.join([name, *others])})"
                )


def pause(
    session: Session,
    catalog: Catalog,
    models: Iterable[str],
    *,
    now: bool = False,
    reason: str | None = None,
    by: str | None = None,
) -> list[Pause]:
    """Pause the models (again: `now` and the reason updated; `now` never undone by a
    later pause without it). With `now`, their running jobs are asked to yield."""
    models = list(dict.fromkeys(models))
    check(catalog, models, paused(session), "pause")
    done = []
    for name in models:
        row = session.get(ModelPause, name)
        if row is None:
            row = ModelPause(model=name, paused_at=utcnow(), now=now)
            session.add(row)
        row.now = row.now or now
        row.reason = reason if reason is not None else row.reason
        row.paused_by = by if by is not None else row.paused_by
        done.append(row)
    session.flush()
    if now:
        transitions.request_yield(session, Job.model.in_(models), reason=YIELD_PAUSED)
    return [_pause(row) for row in done]


def resume(session: Session, catalog: Catalog, models: Iterable[str]) -> list[str]:
    """Resume the models; returns those that were paused."""
    models = list(dict.fromkeys(models))
    now_paused = paused(session)
    check(catalog, models, set(catalog.models) - set(now_paused), "resume")
    return list(
        session.scalars(
            delete(ModelPause).where(ModelPause.model.in_(models)).returning(ModelPause.model)
        )
    )
