"""Keep a running job's claim alive, independently of progress, and notice losing it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Calls `renew() -> still_owner` every `interval` seconds until closed.

    A False (the reaper or a redelivery took the job, or it was canceled) sets `stop`, which
    ends the run at its next step. A failed renewal (database away) is retried on the next
    tick: the lease is three intervals long, so one blip does not lose it.
    """

    def __init__(self, renew: Callable[[], bool], *, interval: float, stop: threading.Event):
        self._renew = renew
        self._interval = interval
        self._stop = stop
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._closed.wait(self._interval):
            try:
                if not self._renew():
                    self._stop.set()
                    return
            except Exception as exc:  # noqa: BLE001 - keep trying through database blips
                log.warning("lease renewal failed (%s); retrying", type(exc).__name__)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=10)
