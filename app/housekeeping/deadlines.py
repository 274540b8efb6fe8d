"""Deadlines: queued jobs past their `cancel_after` end canceled, worker or not."""

from __future__ import annotations

import logging

from app.db.session import Database
from app.jobs import service, transitions

log = logging.getLogger(__name__)


def cancel_expired(db: Database) -> int:
    """Queued jobs past their cancel_after end canceled/deadline, worker or not."""
    with db.session() as session:
        ids = service.expired_job_ids(session)
        expired = sum(transitions.cancel_expired(session, job_id) for job_id in ids)
    if expired:
        log.info("canceled %d queued job(s) past their deadline", expired)
    return expired
