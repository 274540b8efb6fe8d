"""The hold in a message's claim: a job whose model this worker does not hold, but a busy
worker does, is left to that worker for at most DIFFQ_WARM_HOLD_SECONDS after it was
queued (app/jobs/residency.py). The claim chooses among the other waiting jobs; when
only held jobs wait, it waits (its message unacked, no row locked) and looks again.
When the chosen job's model is held by an idle worker instead, the message goes back to
the queue once (`hands_over`): the broker delivers it to the next consumer with room,
the idle holder, as RabbitMQ rotates its consumers; redelivered, it is claimed wherever
it lands.

Why a hold and not a second copy: in the residency simulation (docs/performance.md) a
free worker that waits for the holder made 0.58x the model loads of starting at once,
with shorter waits, where loads take 6 to 15 s; on real CPU workers with the tiny model
(loads of 0.6 s), the hold with the hand-back made 0.77x the loads, the rarest model's
longest wait 1.46x and the p99 wait 2.7x (`bench/hold.py`). A job is held at most the
bound after it was queued, so a cold model is never starved.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement
from sqlalchemy.orm import Session

from app.db.models.jobs import Job
from app.db.types import utcnow
from app.jobs import fairness, residency
from app.metrics.instruments import WORKER_HOLD_SECONDS

if TYPE_CHECKING:
    from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)

# How often a held claim looks again. A holder that finishes takes its next message
# within milliseconds; a job seen held and then not is claimed only after it stayed
# free for SETTLE_SECONDS, so that this worker does not take it in that instant.
POLL_SECONDS = 0.5
SETTLE_SECONDS = 1.0


class Hold:
    """One message's hold (workers/claim.py)."""

    def __init__(self, rt: WorkerRuntime) -> None:
        self.rt = rt
        self.seconds = rt.settings.warm_hold_seconds
        self.held_since: float | None = None
        self.queue = ""
        self.seen: dict[uuid.UUID, float | None] = {}  # held jobs: when last seen free

    def condition(self, session: Session) -> ColumnElement[bool] | None:
        """The jobs to leave to another worker now (None: no hold)."""
        if self.seconds <= 0:
            return None
        if self.rt.draining.is_set() or self.rt.hand_back_requested.is_set():
            return None  # a shutdown claims as before: its run goes back at once
        if self.held_since is not None and time.monotonic() - self.held_since > self.seconds:
            # One message waits at most the bound too: held jobs that keep arriving never
            # keep a delivery unacked towards the broker's consumer_timeout.
            return None
        mine = [name for name, _ in self.rt.models.held()]
        return residency.held_by_others(session, self.rt.owner, mine, self.seconds)

    def keeps(
        self, session: Session, job: Job, chosen: uuid.UUID | None, held: ColumnElement[bool]
    ) -> bool:
        """Whether the claim waits instead of starting `chosen` (None: a spare permit with
        nothing else waiting)."""
        if chosen is None:
            waiting = fairness.waiting_at(job.queue, job.publish_priority, utcnow())
            return residency.any_held(session, waiting, held)
        if residency.is_held(session, held, chosen):
            self.seen[chosen] = None
            return True
        if chosen in self.seen:  # held a moment ago: free for long enough?
            now = time.monotonic()
            free_since = self.seen[chosen] or now
            self.seen[chosen] = free_since
            return now - free_since < SETTLE_SECONDS
        return False

    def hands_over(self, session: Session, chosen: uuid.UUID, redelivered: bool) -> bool:
        """Whether the message goes back to the queue for an idle worker that holds the
        chosen job's model (once: never a redelivered message)."""
        if redelivered or self.seconds <= 0 or self.rt.draining.is_set():
            return False
        job = session.get(Job, chosen)
        if job is None or job.model in {name for name, _ in self.rt.models.held()}:
            return False
        return residency.idle_holder(session, self.rt.owner, job.model)

    def wait(self, session: Session, job: Job) -> None:
        """Wait a poll, holding nothing in the database."""
        session.rollback()
        now = time.monotonic()
        if self.held_since is None:
            self.held_since, self.queue = now, job.queue
            log.info(
                "the message of job %s waits: its jobs' models are loaded on busy workers",
                job.id,
                extra={"job_id": str(job.id)},
            )
        self.rt.draining.wait(POLL_SECONDS)

    def done(self) -> None:
        if self.held_since is not None:
            WORKER_HOLD_SECONDS.labels(self.queue).inc(time.monotonic() - self.held_since)
