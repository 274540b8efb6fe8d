"""Holding a request until its job finishes: `Prefer: wait=N` (RFC 7240) and the
OpenAI-compatible endpoint.

A waiting request holds one gunicorn thread and no database connection: it sleeps on
the process's JobWatcher (woken by PostgreSQL NOTIFY) and re-reads the job only when it
changed. At most DIFFQ_WAIT_SLOTS requests wait at once per process; past that a request
is answered at once as if it had not asked to wait, so waits never take every thread.
"""

from __future__ import annotations

import re
import threading
import time
import uuid

from app.db.models import Job
from app.jobs import service
from app.web.services import Services

_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*\"?(\d{1,6})\"?", re.IGNORECASE)

_slots_lock = threading.Lock()
_slots_held = 0


def requested_wait(prefer: str | None, cap: int) -> int | None:
    """Seconds asked for by a `Prefer` header (`wait=N`), capped; None if not asked."""
    if not prefer:
        return None
    match = _WAIT.search(prefer)
    if match is None:
        return None
    return min(int(match.group(1)), cap)


def waits_in_progress() -> int:
    return _slots_held


def _take_slot(limit: int) -> bool:
    global _slots_held
    with _slots_lock:
        if _slots_held >= limit:
            return False
        _slots_held += 1
        return True


def _give_slot() -> None:
    global _slots_held
    with _slots_lock:
        _slots_held -= 1


def wait_for_finish(
    svc: Services, tenant_id: uuid.UUID, job_id: uuid.UUID, seconds: float
) -> Job | None:
    """The job once terminal, or None if it is not within `seconds` (or no slot was free).

    The caller must not hold a database session open while this runs.
    """
    if seconds <= 0 or not _take_slot(svc.settings.wait_slots):
        return None
    subscription = svc.watcher.subscribe(job_id)
    try:
        deadline = time.monotonic() + seconds
        while True:
            with svc.db.session() as session:
                job = service.get_job(session, tenant_id, job_id)
            if job is None or job.status.terminal:
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            subscription.wait(left)
    finally:
        subscription.close()
        _give_slot()
