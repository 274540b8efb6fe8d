"""Polling for a condition, for tests that wait on other processes."""

from __future__ import annotations

import sys
import time


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05, what: str = ""):
    """Poll until `predicate()` is truthy and return its value; raise TimeoutError naming
    what was awaited (`what`, else the caller's line) if it never is."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            if not value:
                if not what:
                    caller = sys._getframe(1)
                    what = f"the condition at {caller.f_code.co_filename}:{caller.f_lineno}"
                raise TimeoutError(f"{what} not met in {timeout}s (last: {value!r})")
            return value
        time.sleep(interval)
