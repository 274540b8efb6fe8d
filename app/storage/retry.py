"""Bounded retries with jittered exponential backoff for store writes (tenacity runs the
loop; the delays are ours: equal jitter, for the outage budget below)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from tenacity import Retrying, retry_if_exception, stop_after_attempt

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
    retrying = _retrying("upload", key, retries, backoff, backoff_max, sleep)
    try:
        retrying(storage.put, key, data, content_type)
    except StorageError as exc:
        tries = retrying.statistics["attempt_number"]
        raise StorageUnavailable(f"upload of {key} failed after {tries} attempt(s): {exc}") from exc
    return retrying.statistics["attempt_number"] - 1


def get_with_retry(
    storage: Storage,
    key: str,
    *,
    retries: int,
    backoff: float,
    backoff_max: float,
    sleep: Callable[[float], None] = time.sleep,
) -> bytes:
    """Download, retrying transient errors; a missing object raises its StorageError at
    once (not transient), a store that stays away StorageUnavailable."""
    retrying = _retrying("download", key, retries, backoff, backoff_max, sleep)
    try:
        return retrying(storage.get, key)
    except StorageError as exc:
        if not exc.transient:
            raise
        tries = retrying.statistics["attempt_number"]
        message = f"download of {key} failed after {tries} attempt(s): {exc}"
        raise StorageUnavailable(message) from exc


def get_kept(storage: Storage, key: str, settings: Any, missing: Exception) -> bytes:
    """`get_with_retry` with the settings' retries (`upload_retries`, `upload_backoff`,
    `upload_backoff_max`); an object that is not there raises `missing` instead (a
    store that stays away: StorageUnavailable)."""
    try:
        return get_with_retry(
            storage,
            key,
            retries=settings.upload_retries,
            backoff=settings.upload_backoff,
            backoff_max=settings.upload_backoff_max,
        )
    except StorageUnavailable:
        raise
    except StorageError as exc:
        if exc.transient:
            raise
        raise missing from exc


def _retrying(
    action: str,
    key: str,
    retries: int,
    backoff: float,
    backoff_max: float,
    sleep: Callable[[float], None],
) -> Retrying:
    delays = backoff_delays(retries, backoff, backoff_max)
    retrying = Retrying(
        retry=retry_if_exception(lambda exc: isinstance(exc, StorageError) and exc.transient),
        stop=stop_after_attempt(retries + 1),
        wait=lambda _state: next(delays, 0.0),  # tenacity asks before it checks `stop`
        sleep=sleep,
        before_sleep=lambda state: log.warning(
            "%s of %s failed (%s); retry %d in %.2fs",
            action,
            key,
            state.outcome.exception(),
            state.attempt_number,
            state.upcoming_sleep,
        ),
        reraise=True,
    )
    return retrying
