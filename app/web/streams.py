"""Open event streams (SSE and WebSocket), capped per API process and per tenant.

Each open stream holds one of the process's threads for as long as the client keeps it.
Without a cap one tenant could hold every thread and leave nothing for anyone's submits:
a tenant may hold DIFFQ_MAX_TENANT_STREAMS streams in each process, and the process
DIFFQ_MAX_STREAMS in all (`diffq api` lowers the latter to three quarters of its
threads). Past either, the stream is refused with 429 and Retry-After, before any
thread is held; the tenant's other requests are not affected.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field

from flask_smorest import abort

RETRY_AFTER_SECONDS = 5


@dataclass
class StreamSlots:
    per_process: int  # 0: no cap
    per_tenant: int  # 0: no cap
    _open: Counter = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def open(self) -> int:
        return sum(self._open.values())

    def take(self, tenant_id: uuid.UUID) -> str | None:
        """None when a slot was taken for the tenant; else which cap refused it."""
        with self._lock:
            if self.per_tenant and self._open[tenant_id] >= self.per_tenant:
                return "tenant"
            if self.per_process and sum(self._open.values()) >= self.per_process:
                return "process"
            self._open[tenant_id] += 1
            return None

    def give_back(self, tenant_id: uuid.UUID) -> None:
        with self._lock:
            self._open[tenant_id] -= 1
            if self._open[tenant_id] <= 0:
                del self._open[tenant_id]


class Slot:
    """One stream's slot, given back once, whichever way the stream ends."""

    def __init__(self, slots: StreamSlots, tenant_id: uuid.UUID) -> None:
        self._slots, self._tenant_id = slots, tenant_id
        self._lock = threading.Lock()
        self._held = True

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, False
        if held:
            self._slots.give_back(self._tenant_id)


def take_slot(slots: StreamSlots, tenant_id: uuid.UUID) -> Slot:
    """A slot for one stream of the tenant's, or a 429 naming the cap that refused it."""
    refused = slots.take(tenant_id)
    if refused == "tenant":
        abort(
            429,
            message=f"Too many open event streams for this tenant: at most "
            f"{slots.per_tenant} at once on each API process (DIFFQ_MAX_TENANT_STREAMS). "
            "Close one, or poll GET /v1/jobs/{id}.",
            errors={"streams": ["tenant_streams_cap"]},
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if refused == "process":
        abort(
            429,
            message=f"This API process holds its most open event streams ({slots.per_process}, "
            "DIFFQ_MAX_STREAMS); retry shortly, or poll GET /v1/jobs/{id}.",
            errors={"streams": ["process_streams_cap"]},
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    return Slot(slots, tenant_id)
