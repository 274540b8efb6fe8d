"""Admission: jobs held by a tenant's jobs-in-flight cap are let through (and published)
as that tenant's running jobs finish; old rate-limit windows are forgotten."""

from __future__ import annotations

import logging

from app.broker.publish import Publisher, publish_and_mark
from app.db.models.jobs import Job
from app.db.session import Database
from app.limits import admit_held, forget_old_windows, tenants_with_held_jobs

log = logging.getLogger(__name__)


def release_held(db: Database, publisher: Publisher, *, cap: int) -> int:
    """Let held jobs through as their tenants' jobs in flight finish."""
    with db.session() as session:
        tenants = tenants_with_held_jobs(session)
    released = 0
    for tenant_id in tenants:
        with db.session() as session:
            admitted = admit_held(session, tenant_id, cap)
            jobs = [session.get(Job, job_id) for job_id in admitted]
        for job in jobs:
            # A failed publish leaves it admitted and unpublished: the outbox has it.
            publish_and_mark(db, publisher, job)
        released += len(jobs)
    if released:
        log.info("released %d held job(s) to the broker", released)
    return released


def forget_windows(db: Database) -> None:
    """Rate-limit windows past their minute are deleted."""
    with db.session() as session:
        forget_old_windows(session)
