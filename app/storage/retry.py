"""Bounded retries with jittered exponential backoff for store writes."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from app.storage.base import Storage, StorageError, StorageUnavailable

log = logging.getLogger(__name__)


def backoff_delays(retries: int, base: float, cap: float, rng: random.Random | None = None):
    """Equal jitter: half of min(cap, base * 2**n), plus up to as much again at random.

    Jitter spreads retries from many workers; keeping half of each delay fixed guarantees
    an outage budget: an outage shorter than `outage_budget()` never fails an upload.
    """
    rng = rng or random.Random()
    for attempt in range(retries):
        step = min(cap, base * (2**attempt))
        yield step / 2 + rng.uniform(0, step / 2)


def outage_budget(retries: int, base: float, cap: float) -> float:
    """The shortest time the retries are guaranteed to span."""
    return sum(min(cap, base * (2**attempt)) / 2 for attempt in range(retries))


def put_with_retry(
    storage: Storage,
    key: str,
    data: bytes,
    content_type: str,
    *,
    retries: int,
    backoff: float,
    backoff_max: float,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Upload, retrying transient errors; returns the number of retries it took."""
    delays = backoff_delays(retries, backoff, backoff_max)
    tries = 0
    while True:
        try:
            storage.put(key, data, content_type)
            return tries
        except StorageError as exc:
            delay = next(delays, None) if exc.transient else None
            if delay is None:
                raise StorageUnavailable(
                    f"upload of {key} failed after {tries + 1} attempt(s): {exc}"
                ) from exc
            tries += 1
            log.warning("upload of %s failed (%s); retry %d in %.2fs", key, exc, tries, delay)
            sleep(delay)
