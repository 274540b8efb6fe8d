"""Failed authentication, counted in memory per client address and per key id.

A request without a valid key costs the database nothing once its address (or the key
id it names) has failed DIFFQ_AUTH_FAILURES times in the current minute: it is answered
429 with Retry-After before the key is looked up. Each API process counts on its own
(no shared state, no round trip): behind N processes an address gets at most N times the
budget, which is what a cheap guard in front of the database needs to be.

The table is bounded: past MAX_ENTRIES counters, those of past windows are dropped, and
if it is still full, the oldest half of this window's.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

WINDOW_SECONDS = 60.0
MAX_ENTRIES = 100_000


@dataclass
class FailureCounter:
    """Failures per name ("addr:…" or "key:…") in fixed windows of WINDOW_SECONDS."""

    limit: int  # failures a window per name; 0: not limited
    clock: Callable[[], float] = time.monotonic
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

    def _prune(self, window: int) -> None:
        current = {k: v for k, v in self._counts.items() if v[0] == window}
        if len(current) >= MAX_ENTRIES:
            current = dict(list(current.items())[len(current) // 2 :])
        self._counts = current
