"""Change notifications: PostgreSQL NOTIFY on commit, so watchers need not poll."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.orm import Session

# Payload: "<job id> <queue> <order|progress>". Sent by every change to a job; "order"
# means the change can move other jobs' queue positions (a status or priority change),
# "progress" that only this job's progress moved.
JOB_CHANNEL = "diffq_jobs"
# Payload: the job id. Sent when a running job is canceled, for the worker running it.
CANCEL_CHANNEL = "diffq_cancel"


def notify(session: Session, channel: str, payload: str) -> None:
    """Queue a notification that PostgreSQL delivers when (and only if) this commits.

    SQLite has no NOTIFY: there, watchers poll the job's version instead.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_notify(:channel, :payload)"), {"channel": channel, "payload": payload}
        )


def job_changed_payload(job_id: uuid.UUID, queue: str, order_changed: bool) -> str:
    return f"{job_id} {queue} {'order' if order_changed else 'progress'}"


def parse_job_changed(payload: str) -> tuple[uuid.UUID, str, bool] | None:
    """(job id, queue, whether the queue order moved), or None for a foreign payload."""
    try:
        job_id, queue, kind = payload.split(" ")
        return uuid.UUID(job_id), queue, kind == "order"
    except ValueError:
        return None
