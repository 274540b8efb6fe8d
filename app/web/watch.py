"""Fan-out of job changes to open event streams, once per API process.

With PostgreSQL, one LISTEN connection per process receives every change and wakes the
streams watching that job, and, when the change moves a queue (a job started, finished
or was reprioritised), the streams of jobs still waiting in that queue. With SQLite
(embedded mode), one thread polls the versions of the watched jobs and wakes waiting
streams every few seconds. Either way no stream polls the database on its own.
"""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict

from sqlalchemy import select

from app.db.models import Job
from app.db.session import Database
from app.jobs.listener import Listener
from app.jobs.notify import JOB_CHANNEL, parse_job_changed

POLL_SECONDS = 0.25
QUEUE_POLL_SECONDS = 2.0  # SQLite only: how often waiting streams re-read their position


class Subscription:
    def __init__(self, watcher: JobWatcher, job_id: uuid.UUID) -> None:
        self.job_id = job_id
        self.queue: str | None = None
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._own_change = False
        # The job's own changes since the last wait, each (version, progress) where its
        # notification carried them, else None; `changes` holds those the last wait took.
        self._changes: list[tuple[int, dict] | None] = []
        self.changes: list[tuple[int, dict] | None] = []
        self._watcher = watcher

    def wake(self, own: bool = True, carried: tuple[int, dict] | None = None) -> None:
        """`own`: the job itself changed (`carried`: its new version and progress, where
        the notification carried them); otherwise only its queue moved."""
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

    def carried_since(self, version: int) -> tuple[int, dict] | None:
        """After a wait: the job's version and progress now, when every change since
        `version` was a progress write whose notification carried it, one version after
        the other; None when the row must be read (any other change, a gap, a reconnect).
        Notifications arrive in commit order, and each change of a job adds one to its
        version, so a gapless run of carried progress is all that changed."""
        if not self.changes:
            return None
        for change in self.changes:
            if change is None or change[0] != version + 1:
                return None
            version = change[0]
        return self.changes[-1]

    def follow_queue(self, queue: str | None) -> None:
        """While the job is queued, also wake on changes that move `queue`."""
        self._watcher._follow_queue(self, queue)

    def close(self) -> None:
        self._watcher._remove(self)


class JobWatcher:
    def __init__(self, db: Database) -> None:
        self._db = db
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
        carried: tuple[int, dict] | None = None,
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
                (change.version, change.progress)
                if change.version is not None and change.progress is not None
                else None
            )
            self._wake(change.job_id, change.queue if change.order_changed else None, carried)

    def _ensure_started(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        if self._db.engine.dialect.name == "postgresql":
            self._listener = Listener(self._db.url, [JOB_CHANNEL], self._on_notify).start()
        else:
            threading.Thread(target=self._poll, name="job-version-poller", daemon=True).start()

    def _poll(self) -> None:
        ticks_per_queue_poll = round(QUEUE_POLL_SECONDS / POLL_SECONDS)
        tick = 0
        while not self._stop.is_set():
            tick += 1
            with self._lock:
                watched = list(self._by_job)
                queues = list(self._by_queue)
            if watched:
                with self._db.session() as session:
                    rows = session.execute(
                        select(Job.id, Job.version).where(Job.id.in_(watched))
                    ).all()
                for job_id, version in rows:
                    if self._versions.get(job_id) != version:
                        self._versions[job_id] = version
                        self._wake(job_id)
            if tick % ticks_per_queue_poll == 0:
                for queue in queues:
                    self._wake(None, queue)
            self._stop.wait(POLL_SECONDS)
