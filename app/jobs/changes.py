"""Who hears of a job's change, inside the transaction that makes it.

`transitions.change` calls every listener with the session and what changed, before the
caller commits: a listener's writes (a webhook event row, say) commit with the change or
not at all. The state machine knows no listener; each registers itself when its module
is imported (`app/webhooks/events.py`), and every process that changes jobs imports it
(tests/unit/test_boundaries.py checks each entry point).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.jobs.states import JobStatus

# The events a job's webhook may subscribe to, and those it gets when it names none.
EVENT_TYPES = ("job.running", "job.progress", "job.succeeded", "job.failed", "job.canceled")
DEFAULT_EVENTS = ("job.succeeded", "job.failed", "job.canceled")


def selected(webhook_events: list[str] | None) -> tuple[str, ...]:
    """The events a job with these `webhook_events` is sent."""
    return tuple(webhook_events) if webhook_events else DEFAULT_EVENTS


@dataclass(frozen=True)
class JobChange:
    job_id: uuid.UUID
    status: JobStatus | None  # the status it moved to; None when the status did not change
    progressed: bool  # its progress was written
    webhook_url: str | None
    webhook_events: list[str] | None


Listener = Callable[[Session, JobChange], None]
_listeners: list[Listener] = []


def on_change(listener: Listener) -> Listener:
    """Call `listener` for every job change in this process (once, however often asked)."""
    if listener not in _listeners:
        _listeners.append(listener)
    return listener


def listeners() -> tuple[Listener, ...]:
    return tuple(_listeners)


def emit(session: Session, change: JobChange) -> None:
    for listener in tuple(_listeners):
        listener(session, change)
