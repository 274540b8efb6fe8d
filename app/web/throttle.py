"""Failed authentication, counted per client address, shared by the API processes.

A request without a valid key costs the database nothing once its address has failed
DIFFQ_AUTH_FAILURES times in the current minute: it is answered 429 with Retry-After
before the key is looked up. Each failure is counted in this process and, where a shared
store is given (`SharedFailures`: the `auth_failures` table), in the count every API
process adds to; the answer is the address's count over all of them. A process learns
that an address is over the limit at its own next failure from it, so behind N processes
an address gets at most the budget plus N - 1 failures a minute (without the shared count
it was N times the budget), while a request that does not fail costs no extra round trip.
A store that cannot be reached leaves this process's own count in force.

Windows are minutes of the wall clock (every process's the same). The in-memory table is
bounded: past MAX_ENTRIES counters, those of past windows are dropped, and if it is still
full, the oldest half of this window's.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import delete
from sqlalchemy.exc import SQLAlchemyError

from app.db.models.limits import AuthFailure

log = logging.getLogger(__name__)

WINDOW_SECONDS = 60.0
MAX_ENTRIES = 100_000


@dataclass
class FailureCounter:
    """Failures per name ("addr:…" or "key:…") in fixed windows of WINDOW_SECONDS."""

    limit: int  # failures a window per name; 0: not limited
    clock: Callable[[], float] = time.time
    # Adds one failure of (name, window) to the count all processes share; returns it.
    shared: Callable[[str, int], int] | None = None
    _counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (window, n)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _window(self) -> int:
        return int(self.clock() // WINDOW_SECONDS)

    def retry_after(self, *names: str | None) -> int | None:
        """Seconds until the window ends, when any of `names` is past the limit; else None."""
        if self.limit <= 0:
            return None
        window = self._window()
        with self._lock:
            blocked = any(
                self._counts.get(name, (window, 0)) >= (window, self.limit)
                for name in names
                if name is not None
            )
        if not blocked:
            return None
        return max(1, math.ceil((window + 1) * WINDOW_SECONDS - self.clock()))

    def failed(self, *names: str | None) -> None:
        if self.limit <= 0:
            return
        window = self._window()
        with self._lock:
            if len(self._counts) >= MAX_ENTRIES:
                self._prune(window)
            for name in names:
                if name is None:
                    continue
                seen, count = self._counts.get(name, (window, 0))
                self._counts[name] = (window, count + 1 if seen == window else 1)
        if self.shared is None:
            return
        for name in names:
            if name is None:
                continue
            try:
                total = self.shared(name, window)
            except SQLAlchemyError as exc:  # the store away: this process's count holds
                log.info("failed-auth count not shared (%s: %s)", type(exc).__name__, exc)
                return
            with self._lock:
                seen, count = self._counts.get(name, (window, 0))
                if seen == window and total > count:
                    self._counts[name] = (window, total)

    def _prune(self, window: int) -> None:
        current = {k: v for k, v in self._counts.items() if v[0] == window}
        if len(current) >= MAX_ENTRIES:
            current = dict(list(current.items())[len(current) // 2 :])
        self._counts = current


class SharedFailures:
    """The `auth_failures` table as `FailureCounter.shared`: one upsert a failure, in a
    transaction of its own; the first failure of a new minute drops past minutes' rows."""

    def __init__(self, db) -> None:
        self.db = db
        self._pruned = -1

    def __call__(self, name: str, window: int) -> int:
        engine = self.db.engine
        if engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        upsert = insert(AuthFailure).values(name=name, window=window, count=1)
        upsert = upsert.on_conflict_do_update(
            index_elements=[AuthFailure.name, AuthFailure.window],
            set_={"count": AuthFailure.count + 1},
        ).returning(AuthFailure.count)
        with engine.begin() as connection:
            total = connection.execute(upsert).scalar_one()
            if self._pruned != window:
                connection.execute(delete(AuthFailure).where(AuthFailure.window < window))
                self._pruned = window
        return int(total)
