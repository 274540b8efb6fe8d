"""A pool child is forked while the worker's watch threads run (workers/forkguard.py): the
fork waits for the tick in progress, and the child never inherits a resource lock held
by a parent thread."""

from __future__ import annotations

import os
import threading

import pytest

from app.services import resource
from workers import forkguard

pytestmark = pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="no fork here")


def child_exit_code(body) -> int:
    """Fork; the child runs `body()` (its truth is the exit code 0) and exits at once."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os._exit(0 if body() else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_fork_waits_for_the_watch_tick_in_progress():
    forkguard.install()
    inside, release = threading.Event(), threading.Event()
    finished = []

    def tick() -> None:
        with forkguard.ticking():
            inside.set()
            release.wait(10)
            finished.append(True)  # the tick's last step, inside the guard

    thread = threading.Thread(target=tick)
    thread.start()
    inside.wait(10)
    threading.Timer(0.2, release.set).start()  # the tick ends while the fork waits
    # The child sees the tick finished: the fork could not start in its middle.
    assert child_exit_code(lambda: bool(finished)) == 0
    thread.join(10)


def test_the_child_gets_a_free_resource_lock_and_a_free_guard():
    forkguard.install(resource.reset_lock)  # as tasks/boot/gpu.py does
    holding, release = threading.Event(), threading.Event()

    def build() -> None:  # a parent thread building a resource at the fork
        with resource._lock:
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=build)
    thread.start()
    holding.wait(10)
    try:

        def free() -> bool:
            with forkguard.ticking():
                return resource._lock.acquire(timeout=5)

        assert child_exit_code(free) == 0
    finally:
        release.set()
        thread.join(10)
