"""Fan-out of job changes to open event streams, once per API process.

With PostgreSQL, one LISTEN connection per process receives every change and wakes the
streams watching that job, and, when the change moves a queue (a job started, finished
or was reprioritised), the streams of jobs still waiting in that queue. A progress
write's notification carries the job's version and progress, which a running job's
stream sends on without reading the row; with DIFFQ_PROGRESS_NOTIFY=poll, progress
writes notify nothing, and one thread reads the version, status and progress of the
running jobs the process's streams follow, every 0.25 s, in one statement (docs/scale.md).
With SQLite (embedded mode), that thread reads every watched job that way, and
wakes the streams of waiting jobs every few seconds. Either way no stream polls the
database on its own.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import defaultdict
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from app.db.models.jobs import Job
from app.db.session import Database
from app.jobs.listener import Listener
from app.jobs.notify import JOB_CHANNEL, parse_job_changed
from app.jobs.states import JobStatus

log = logging.getLogger(__name__)

POLL_SECONDS = 0.25
QUEUE_POLL_SECONDS = 2.0  # SQLite only: how often waiting streams re-read their position


class Carried(NamedTuple):
    """A job's state as a notification or a poll carried it: enough for a stream to send
    a progress event without reading the row."""

    version: int
    status: str
    progress: dict


class Subscription:
    def __init__(self, watcher: JobWatcher, job_id: uuid.UUID) -> None:
        self.job_id = job_id
        self.queue: str | None = None
        self.follows_progress = False
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._own_change = False
        # The job's own changes since the last wait, each as carried, or None where the
        # change came without its state; `changes` holds those the last wait took.
        self._changes: list[Carried | None] = []
        self.changes: list[Carried | None] = []
        self._watcher = watcher

    def wake(self, own: bool = True, carried: Carried | None = None) -> None:
        """`own`: the job itself changed (`carried`: its state after, where the
        notification or the poll carried it); otherwise only its queue moved."""
        with self._lock:
            if own:
                self._changes.append(carried)
            self._own_change = self._own_change or own
            self._event.set()

    def wait(self, timeout: float) -> str | None:
        """ "job" if the job changed, "queue" if only its queue moved, None on timeout."""
        woke = self._event.wait(timeout)
        with self._lock:
            self._event.clear()
            own, self._own_change = self._own_change, False
            self.changes, self._changes = self._changes, []
        if not woke:
            return None
        return "job" if own else "queue"

    def carried(self) -> Carried | None:
        """After a wait: the newest state the job's changes carried, or None when one came
        without it (a change of anything but progress, a reconnect) or none came: then
        the row must be read. Every change but a progress write is notified without its
        state, so carried states alone mean only progress moved since the last read,
        unless the newest carries another status. A state no newer than the stream's
        own is old news (a poll of what a read already saw)."""
        if not self.changes or any(change is None for change in self.changes):
            return None
        return max(self.changes, key=lambda change: change.version)

    def follow_queue(self, queue: str | None) -> None:
        """While the job is queued, also wake on changes that move `queue`."""
        self._watcher._follow_queue(self, queue)

    def follow_progress(self, running: bool) -> None:
        """While the job runs, have its progress polled where writes do not notify it."""
        self.follows_progress = running

    def close(self) -> None:
        self._watcher._remove(self)


class JobWatcher:
    def __init__(self, db: Database, poll_progress: bool = False) -> None:
        """`poll_progress`: on PostgreSQL, read the progress of the running jobs streams
        follow (progress writes notify nothing: DIFFQ_PROGRESS_NOTIFY=poll)."""
        self._db = db
        self._poll_progress = poll_progress
        self._by_job: dict[uuid.UUID, set[Subscription]] = defaultdict(set)
        self._by_queue: dict[str, set[Subscription]] = defaultdict(set)
        self._lock = threading.Lock()
        self._started = False
        self._versions: dict[uuid.UUID, int] = {}
        self._stop = threading.Event()
        self._listener: Listener | None = None

    def subscribe(self, job_id: uuid.UUID) -> Subscription:
        self._ensure_started()
        sub = Subscription(self, job_id)
        with self._lock:
            self._by_job[job_id].add(sub)
        return sub

    def close(self) -> None:
        """Stops the LISTEN connection or the poller: for a process that outlives its API
        (the tests' in-process apps, whose database is dropped after them)."""
        self._stop.set()
        if self._listener is not None:
            self._listener.stop()

    def _follow_queue(self, sub: Subscription, queue: str | None) -> None:
        with self._lock:
            if sub.queue == queue:
                return
            self._discard(self._by_queue, sub.queue, sub)
            sub.queue = queue
            if queue is not None:
                self._by_queue[queue].add(sub)

    @staticmethod
    def _discard(index: dict, key, sub: Subscription) -> None:
        subs = index.get(key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del index[key]

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            self._discard(self._by_queue, sub.queue, sub)
            self._discard(self._by_job, sub.job_id, sub)
            if sub.job_id not in self._by_job:
                self._versions.pop(sub.job_id, None)

    def _wake(
        self,
        job_id: uuid.UUID | None,
        queue: str | None = None,
        carried: Carried | None = None,
    ) -> None:
        with self._lock:
            if job_id is None and queue is None:
                own = {s for subs in self._by_job.values() for s in subs}
            else:
                own = set(self._by_job.get(job_id, ()))
            moved = set(self._by_queue.get(queue, ())) - own
        for sub in own:
            sub.wake(own=True, carried=carried)
        for sub in moved:
            sub.wake(own=False)

    def _on_notify(self, _channel: str | None, payload: str | None) -> None:
        if payload is None:
            self._wake(None)  # reconnected: changes may have been missed
            return
        change = parse_job_changed(payload)
        if change is not None:
            carried = (
                Carried(change.version, JobStatus.RUNNING.value, change.progress)
                if change.version is not None and change.progress is not None
                else None  # a progress write's carried state: its job is running
            )
            self._wake(change.job_id, change.queue if change.order_changed else None, carried)

    def _ensure_started(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        if self._db.engine.dialect.name == "postgresql":
            self._listener = Listener(self._db.listen_url, [JOB_CHANNEL], self._on_notify).start()
            if self._poll_progress:
                threading.Thread(
                    target=self._poll, args=(True,), name="job-progress-poller", daemon=True
                ).start()
        else:
            threading.Thread(
                target=self._poll, args=(False,), name="job-version-poller", daemon=True
            ).start()

    def _watched(self, running_only: bool) -> list[uuid.UUID]:
        with self._lock:
            if not running_only:
                return list(self._by_job)
            return [
                job_id
                for job_id, subs in self._by_job.items()
                if any(sub.follows_progress for sub in subs)
            ]

    def _poll(self, running_only: bool) -> None:
        """Every POLL_SECONDS, one read of the watched jobs' versions and states (only the
        running ones followed for progress where PostgreSQL notifies the rest); a job whose
        version moved wakes its streams with its state. Without NOTIFY (SQLite), the
        streams of waiting jobs are woken every QUEUE_POLL_SECONDS too."""
        ticks_per_queue_poll = round(QUEUE_POLL_SECONDS / POLL_SECONDS)
        tick = 0
        while not self._stop.is_set():
            tick += 1
            watched = self._watched(running_only)
            if watched:
                try:
                    with self._db.session() as session:
                        rows = session.execute(
                            select(Job.id, Job.version, Job.status, Job.progress).where(
                                Job.id.in_(watched)
                            )
                        ).all()
                except SQLAlchemyError as exc:  # the database away: the next tick retries
                    log.warning("job poll failed (%s)", type(exc).__name__)
                    rows = []
                for job_id, version, status, progress in rows:
                    if self._versions.get(job_id) != version:
                        self._versions[job_id] = version
                        self._wake(job_id, carried=Carried(version, status.value, progress or {}))
            if not running_only and tick % ticks_per_queue_poll == 0:
                with self._lock:
                    queues = list(self._by_queue)
                for queue in queues:
                    self._wake(None, queue)
            self._stop.wait(POLL_SECONDS)
