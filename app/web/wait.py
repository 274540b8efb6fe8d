"""Holding a request until its job finishes: `Prefer: wait=N` (RFC 7240) and the
OpenAI-compatible endpoint.

A waiting request holds one gunicorn thread and no database connection: it sleeps on
the process's JobWatcher (woken by PostgreSQL NOTIFY) and re-reads the job only when it
changed. A wait holds a thread as an event stream does, so it takes a slot of the same
caps (app/web/streams.py): DIFFQ_MAX_TENANT_STREAMS per tenant and DIFFQ_MAX_STREAMS per
process, for streams and waits together; and at most DIFFQ_WAIT_SLOTS requests wait at
once per process. Past any of them there is no wait (`NoWaitSlot`): one tenant's waits
never take every thread, nor another tenant's turn.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from typing import TYPE_CHECKING

from app.db.models.jobs import Job
from app.jobs import service

if TYPE_CHECKING:
    from app.web.root import ApiRoot

_slots_lock = threading.Lock()
_slots_held = 0

_PREFERENCE = re.compile(r"\s*([^=\s]+)\s*(?:=\s*(.*?))?\s*$")


class NoWaitSlot(Exception):
    """No wait took place: the tenant's held requests, or the process's, are at a cap."""

    def __init__(self, cap: str, limit: int) -> None:
        super().__init__(cap)
        self.cap, self.limit = cap, limit


class BadPreference(ValueError):
    """A `wait` preference that is not a whole number of seconds (safe to show)."""


def requested_wait(prefer: str | None, cap: int) -> int | None:
    """Seconds asked for by a `Prefer` header (`wait=N`), capped; None if not asked.

    Other preferences (`respond-async`, `return=minimal`, …) are ignored, as RFC 7240
    lets a server do; a `wait` whose value is not a whole number of seconds (`wait=abc`,
    `wait=-5`, `wait=`) raises BadPreference rather than being ignored: the client meant
    to wait and would not learn why it did not. `wait=0` asks for no wait.
    """
    if not prefer:
        return None
    for item in re.split(r"[,;]", prefer):
        match = _PREFERENCE.match(item)
        if match is None or match.group(1).lower() != "wait":
            continue
        value = (match.group(2) or "").strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].strip()
        if not value.isascii() or not value.isdigit():
            raise BadPreference(
                f"wait must be a whole number of seconds (0 or more), not {value[:40]!r}."
            )
        return min(int(value), cap)
    return None


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


class WaitSlot:
    """One waiting request's slot: the tenant's and the process's held-request caps
    (shared with event streams) and DIFFQ_WAIT_SLOTS. `take` raises NoWaitSlot."""

    def __init__(self, svc: ApiRoot, tenant_id: uuid.UUID) -> None:
        self._svc, self._tenant_id = svc, tenant_id
        refused = svc.streams.take(tenant_id)
        if refused is not None:
            limit = svc.streams.per_tenant if refused == "tenant" else svc.streams.per_process
            raise NoWaitSlot(refused, limit)
        if not _take_slot(svc.settings.wait_slots):
            svc.streams.give_back(tenant_id)
            raise NoWaitSlot("waits", svc.settings.wait_slots)
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            _give_slot()
            self._svc.streams.give_back(self._tenant_id)


def wait_for_job(
    svc: ApiRoot,
    tenant_id: uuid.UUID,
    job_id: uuid.UUID,
    seconds: float,
    slot: WaitSlot | None = None,
) -> Job | None:
    """The job as it is once it finished, or as it is when `seconds` have passed: a wait
    that runs out answers with the job's state then, not the one it was submitted in.
    None when `seconds` <= 0 or the job is gone. Without a `slot` held by the caller, it
    takes one (NoWaitSlot when a cap leaves none) and gives it back.

    The caller must not hold a database session open while this runs.
    """
    if seconds <= 0:
        return None
    held = slot or WaitSlot(svc, tenant_id)
    try:
        return _wait(svc, tenant_id, job_id, seconds)
    finally:
        if slot is None:
            held.release()


def _wait(svc: ApiRoot, tenant_id: uuid.UUID, job_id: uuid.UUID, seconds: float) -> Job | None:
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
                return job
            subscription.wait(left)
    finally:
        subscription.close()


def wait_for_finish(
    svc: ApiRoot, tenant_id: uuid.UUID, job_id: uuid.UUID, seconds: float, slot: WaitSlot
) -> Job | None:
    """The job once terminal, or None if it is not within `seconds`, on the caller's slot.

    The caller must not hold a database session open while this runs.
    """
    job = wait_for_job(svc, tenant_id, job_id, seconds, slot)
    return job if job is not None and job.status.terminal else None
