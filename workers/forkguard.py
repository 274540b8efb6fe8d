"""A GPU worker's main process forks its pool children at any time (at start, and to
replace one that died), while its watch threads (workers/stranded.py, workers/pausing.py)
query the database. A child inherits every lock as it was at the fork, held by threads
that do not exist in it: a fork in the middle of a tick could hand the child a lock that
is never released (a module being imported, a resource being built, SQLAlchemy's mapper
lock), and its first use there hangs until the job's time limit.

So a tick runs under `ticking()`, and the fork waits for the tick in progress to end
(`os.register_at_fork`). The wait is bounded: a tick stuck on an unreachable database
delays a fork by at most `FORK_WAIT` seconds, then the fork goes ahead, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

FORK_WAIT = 5.0  # seconds a fork waits for the tick in progress

_guard = threading.Lock()
_held_for_fork = False
_installed = False
_child_resets: list[Callable[[], None]] = []


@contextlib.contextmanager
def ticking() -> Iterator[None]:
    """One watch tick: no fork starts while it runs."""
    with _guard:
        yield


def _before_fork() -> None:
    global _held_for_fork
    _held_for_fork = _guard.acquire(timeout=FORK_WAIT)
    if not _held_for_fork:
        log.warning("forking while a watch tick runs (it took over %ss)", FORK_WAIT)


def _after_fork_in_parent() -> None:
    global _held_for_fork
    if _held_for_fork:
        _held_for_fork = False
        _guard.release()


def _after_fork_in_child() -> None:
    global _guard, _held_for_fork
    # The child has no watch threads: a fresh lock, whatever the parent's state.
    _guard, _held_for_fork = threading.Lock(), False
    for reset in _child_resets:
        reset()


def install(*child_resets: Callable[[], None]) -> None:
    """Make this process's forks wait for the watch tick in progress (once); each of
    `child_resets` runs in every child (a lock a parent thread may hold, made anew)."""
    global _installed
    _child_resets.extend(r for r in child_resets if r not in _child_resets)
    if not _installed:
        os.register_at_fork(
            before=_before_fork,
            after_in_parent=_after_fork_in_parent,
            after_in_child=_after_fork_in_child,
        )
        _installed = True
