"""Finding and killing the processes that run a job (from the job's lease owner)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from app.jobs.states import JobStatus


def child_pid(row) -> int | None:
    """The pool process running a job: its lease owner is "host:pid:nonce"."""
    if row is None or row.status != JobStatus.RUNNING or not row.lease_owner:
        return None
    try:
        return int(row.lease_owner.split(":")[1])
    except (IndexError, ValueError):
        return None


def parent_pid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def is_celery(pid: int) -> bool:
    try:
        return b"celery" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _still_running(reread, row) -> bool:
    fresh = reread(str(row.id))
    return (
        fresh is not None
        and fresh.status == JobStatus.RUNNING
        and fresh.lease_owner == row.lease_owner
    )


def _alone(row, siblings) -> bool:
    """No other job is running under the same lease owner (pool process). A job whose
    denoising ended stays `running`, its lease held, while the process's post-processing
    thread encodes and records it, and meanwhile the process denoises its next job:
    killing it then would hit that next job (one found killed three times, dead-lettered)."""
    if siblings is None:
        return True
    return not [
        other
        for other in siblings()
        if str(other.id) != str(row.id)
        and other.status == JobStatus.RUNNING
        and other.lease_owner == row.lease_owner
    ]


def kill_child(row, reread, siblings=None) -> bool:
    """SIGKILL the pool process running `row`, and only while it runs that job alone.

    The process is frozen first and the job re-read (`reread(job_id) -> row`): a row read a
    moment ago may describe a job the process has since finished, and killing it then would
    hit whatever it runs next. With `siblings` (`() -> rows`), the process is also spared
    while another of those jobs runs under the same owner (`_alone`).
    """
    pid = child_pid(row)
    if pid is None or not is_celery(pid):
        return False
    try:
        os.kill(pid, signal.SIGSTOP)
        if not _still_running(reread, row) or not _alone(row, siblings):
            os.kill(pid, signal.SIGCONT)
            return False
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def worker_main_pid(row) -> int | None:
    """The Celery main process (consumer) of the worker running `row`."""
    pid = child_pid(row)
    main = parent_pid(pid) if pid else None
    return main if main and is_celery(main) else None


def kill_worker(main: int, row=None, reread=None) -> bool:
    """SIGKILL a whole Celery worker: its main process leads its own process group. Given a
    row, only while that worker still runs that job (frozen and re-read, as above)."""
    try:
        os.killpg(main, signal.SIGSTOP)
        if row is not None and not _still_running(reread, row):
            os.killpg(main, signal.SIGCONT)
            return False
        os.killpg(main, signal.SIGKILL)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + 10
    while Path(f"/proc/{main}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return True
