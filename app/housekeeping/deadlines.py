"""Deadlines: jobs past their `cancel_after` end canceled, worker or not (a running one
stops at its next step)."""

from __future__ import annotations

import logging

from app.db.session import Database
from app.jobs import service, transitions

log = logging.getLogger(__name__)


def cancel_expired(db: Database) -> int:
    """Jobs past their cancel_after end canceled/deadline, worker or not."""
    with db.session() as session:
        ids = service.expired_job_ids(session)
        expired = sum(transitions.cancel_expired(session, job_id) for job_id in ids)
    if expired:
        log.info("canceled %d job(s) past their deadline", expired)
    return expired
