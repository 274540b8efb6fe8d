"""Encode, upload and record a finished job on a thread of its own, so that the GPU starts
the next job meanwhile.

The job's message is acked when its generation is handed over here (the task returns);
from then on the job's lease in PostgreSQL is what keeps it from being lost: the lease
keeper of the job runs until its outcome is recorded, and if this process dies first the
lease expires and the relay requeues the job. See docs/gpu.md, "Post-processing off the
critical path".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger(__name__)


class PostProcessor:
    """At most `depth` finished jobs in post-processing at once, each on its own thread
    (PNG encoding and uploads release the GIL, so they run beside each other and beside
    the GPU's launch thread).

    A job handed over when `depth` are pending blocks the caller (the GPU) until one is
    done: a slow store slows generation instead of filling memory with images.
    """

    def __init__(self, depth: int = 2) -> None:
        self._slots = threading.BoundedSemaphore(depth)
        self._executor = ThreadPoolExecutor(max_workers=depth, thread_name_prefix="postprocess")
        self._pending: set[Future] = set()
        self._lock = threading.Lock()

    def submit(self, work: Callable[[], object]) -> Future:
        self._slots.acquire()

        def run() -> object:
            try:
                return work()
            except Exception:
                # The lease stops being renewed; the relay requeues the job.
                log.exception("post-processing failed; the job's lease will expire")
                raise
            finally:
                self._slots.release()

        future = self._executor.submit(run)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: Future) -> None:
        with self._lock:
            self._pending.discard(future)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for every handed-over job to be recorded; False if `timeout` ran out."""
        with self._lock:
            waiting = list(self._pending)
        done = True
        for future in waiting:
            try:
                future.result(timeout=timeout)
            except TimeoutError:
                done = False
            except Exception:  # noqa: BLE001 (logged in run)
                pass
        return done

    def close(self, timeout: float | None = None) -> bool:
        done = self.drain(timeout)
        self._executor.shutdown(wait=done, cancel_futures=False)
        return done
