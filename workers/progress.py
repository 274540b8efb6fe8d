"""Progress off the denoising loop: steps are handed to a writer thread, stages written inline.

The step callback only records the latest step (no I/O), so a slow or distant database
never holds the GPU. A writer thread flushes the latest step at most once per interval.
Stage changes (encoding the prompt, uploading) are written at once, after any step
write in flight, so the row never goes backwards.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from app.jobs.transitions import progress_of

log = logging.getLogger(__name__)


class ProgressReporter:
    """`write(progress) -> still_owner`; a False (canceled, taken over) stops the run.

    `stop`, when set (a cancel notification), ends the run at the next step without
    waiting for a write to find out.
    """

    def __init__(
        self,
        write: Callable[[dict[str, Any]], bool],
        *,
        interval: float,
        stop: threading.Event | None = None,
    ) -> None:
        self._write = write
        self._interval = interval
        self._stop = stop or threading.Event()
        self._lock = threading.Lock()  # one write at a time, in order
        self._pending: dict[str, Any] | None = None
        self._wake = threading.Event()  # a step is pending (or closing)
        self._rest = threading.Event()  # set only to cut the rest short when closing
        self._closed = False
        # Closing joins the writer: the post-processing thread (its stage write) and the
        # task's thread (the run's end) may close at once, and two threads joining one
        # thread together race inside CPython 3.11's Thread.join. One at a time.
        self._closing = threading.Lock()
        self._thread: threading.Thread | None = None
        self.writes = 0
        self.owner = True
        self.last_step = 0
        # The first step seen and when (monotonic): the pace counts from it, so neither the
        # time before denoising (loading, encoding the prompt) nor a resumed run's earlier
        # steps make it look slower or faster than it runs.
        self._first: tuple[int, float] | None = None

    def _emit(self, progress: dict[str, Any]) -> bool:
        with self._lock:
            self.writes += 1
            if not self._write(progress):
                self.owner = False
            return self.owner

    def stage(self, stage: str, step: int = 0, total: int = 0) -> bool:
        """Write a stage change now. After the denoising steps, this ends the step writer
        first, so that no step lands after the stage."""
        if self._thread is not None:
            self.close()
        return self._emit(progress_of(stage, step, total))

    def begin(self, stage: str, step: int = 0, total: int = 0) -> bool:
        """Hand the run's first stage to the writer thread and return at once: the job
        was claimed a moment ago, so the write need not hold the GPU (it ran between two
        jobs, one database round trip). A write that finds the job lost stops the run at
        its first step, as a step's write does."""
        if self._stop.is_set():
            self.owner = False
        if not self.owner:
            return False
        self._queue(progress_of(stage, step, total))
        return True

    def _queue(self, progress: dict[str, Any]) -> None:
        self._pending = progress
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._flush_loop, name="progress", daemon=True)
            self._thread.start()
        self._wake.set()

    def step(self, step: int, total: int) -> bool:
        """Record a denoising step (no I/O); False once the job is no longer ours."""
        self.last_step = step
        if self._stop.is_set():
            self.owner = False
        if not self.owner:
            return False
        stage = "decoding" if step >= total else "denoising"
        self._queue(progress_of(stage, step, total, self._pace(step)))
        return True

    def _pace(self, step: int) -> float | None:
        """Seconds per denoising step since the first step this run saw (None before two)."""
        now = time.monotonic()
        if self._first is None or step < self._first[0]:
            self._first = (step, now)
        first_step, first_at = self._first
        return (now - first_at) / (step - first_step) if step > first_step else None

    def _flush_loop(self) -> None:
        """Write the newest pending step, then rest for the interval; idle while none come."""
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            progress, self._pending = self._pending, None
            if progress is not None:
                try:
                    self._emit(progress)
                except Exception as exc:  # noqa: BLE001 - progress is best effort
                    log.warning("progress write failed (%s); the next one may succeed", exc)
            if self._interval > 0:
                self._rest.wait(self._interval)

    def close(self) -> None:
        """Stop the writer; a step not yet written is dropped (a stage write follows)."""
        self._closed = True
        self._pending = None
        self._wake.set()
        self._rest.set()
        with self._closing:
            if self._thread is not None:
                self._thread.join(timeout=10)
