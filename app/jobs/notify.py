"""Change notifications: PostgreSQL NOTIFY on commit, so watchers need not poll."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

# Payload: "<job id> <queue> <order|progress>". Sent by every change to a job; "order"
# means the change can move other jobs' queue positions (a status or priority change),
# "progress" that only this job's progress moved. A progress write's also carries the
# job's new version and progress, "<job id> <queue> progress <version> <progress JSON>",
# so that a stream following the job sends it on without reading the row
# (docs/scale.md: at a fleet's scale those reads were most of the API's work).
JOB_CHANNEL = "diffq_jobs"
# PostgreSQL refuses a payload of 8000 bytes or more: a larger progress is not carried.
MAX_PAYLOAD_BYTES = 7900
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


@dataclass(frozen=True)
class JobChanged:
    """A job-change notification, parsed."""

    job_id: uuid.UUID
    queue: str
    order_changed: bool  # the change can move other jobs' queue positions
    # A progress write's, where carried: the job's version after it, and its progress.
    version: int | None = None
    progress: dict[str, Any] | None = None


def job_changed_payload(
    job_id: uuid.UUID,
    queue: str,
    order_changed: bool,
    *,
    version: int | None = None,
    progress: dict[str, Any] | None = None,
) -> str:
    """The notification of a change; `version` and `progress` carried only by a change of
    progress alone (and only while the payload stays under PostgreSQL's limit)."""
    payload = f"{job_id} {queue} {'order' if order_changed else 'progress'}"
    if order_changed or version is None or progress is None:
        return payload
    carried = f"{payload} {version} {json.dumps(progress, separators=(',', ':'))}"
    return carried if len(carried.encode()) <= MAX_PAYLOAD_BYTES else payload


def parse_job_changed(payload: str) -> JobChanged | None:
    """The change a payload tells of, or None for a foreign payload. A payload without the
    carried fields (an older worker's) parses with them None."""
    parts = payload.split(" ", 4)
    try:
        job_id, queue, kind = uuid.UUID(parts[0]), parts[1], parts[2]
    except (ValueError, IndexError):
        return None
    if len(parts) == 5 and kind == "progress":
        try:
            version, progress = int(parts[3]), json.loads(parts[4])
        except ValueError:
            return JobChanged(job_id, queue, False)
        if isinstance(progress, dict):
            return JobChanged(job_id, queue, False, version, progress)
        return JobChanged(job_id, queue, False)
    if len(parts) != 3:
        return None
    return JobChanged(job_id, queue, kind == "order")
