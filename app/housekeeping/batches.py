"""Batches (app/batches): the completion window's end, ingests that died, each batch's
end once all its lines have ended (the API records it too, when it reads a batch), and
the purge of ended batches with their jobs after DIFFQ_JOB_RETENTION."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from app.batches import lifecycle
from app.db.session import Database
from app.db.types import utcnow

log = logging.getLogger(__name__)


def batches_pass(
    db: Database, *, job_retention: float, discard: Callable[[list], object] | None = None
) -> dict[str, int]:
    """Batches' windows, ends and purge; `discard` takes the expired jobs' waiting
    messages out of the broker where it can (`Broker.discard`)."""
    done = lifecycle.housekeep(db.session, discard=discard)
    if job_retention > 0:
        with db.session() as session:
            purged = lifecycle.purge(session, utcnow() - timedelta(seconds=job_retention))
        if purged:
            done["purged"] = purged
    if done:
        log.info("batches: %s", ", ".join(f"{k} {v}" for k, v in sorted(done.items())))
    return done
