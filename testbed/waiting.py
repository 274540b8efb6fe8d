"""Polling for a condition, for tests that wait on other processes."""

from __future__ import annotations

import time


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05):
    """Poll until `predicate()` is truthy and return its value; raise TimeoutError if never."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            if not value:
                raise TimeoutError(f"condition not met in {timeout}s")
            return value
        time.sleep(interval)
