"""The one place that puts a job's message on its queue."""

from __future__ import annotations

import atexit
import logging
import threading
import time
import uuid

from kombu import serialization
from sqlalchemy import Engine, bindparam, update
from sqlalchemy.orm import Session

from app.broker.backend import Broker
from app.broker.payload import DELIVER_WEBHOOK_TASK, GENERATE_TASK, build_payload
from app.broker.topology import WEBHOOK_QUEUE
from app.catalog import Catalog, ModelSpec
from app.db import clock
from app.db.models.jobs import Job
from app.db.session import Database, execute_alone, relaxed_commit
from app.db.types import utcnow

log = logging.getLogger(__name__)


class Publisher:
    """Publishes job messages with the Celery app it is given (the root's), declaring the
    broker backend's topology (app/broker/backend.py) once before the first."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        broker: Broker,
        celery_app,
        timeout: float = 2.0,
        pause_after_failure: float = 0.0,
    ) -> None:
        self.catalog = catalog
        self.broker = broker
        self.timeout = timeout
        self.celery = celery_app
        self._declared = False
        self._declaring = threading.Lock()
        # After a failed publish, skip trying for this long (the relay has the job): a
        # broker outage must not add a connect timeout to every submit.
        self.pause_after_failure = pause_after_failure
        self._paused_until = 0.0

    def _ensure_topology(self) -> None:
        if self._declared:
            return
        with self._declaring:  # one thread declares; the burst behind it waits, then goes
            if self._declared:
                return
            with self.celery.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=self.timeout)
                self.broker.declare(conn, [*self.catalog.queues, WEBHOOK_QUEUE])
            self._declared = True

    def _send(
        self,
        task: str,
        args: list,
        queue: str,
        *,
        task_id: str | None = None,
        priority: int | None = None,
        time_limit: float | None = None,
        soft_time_limit: float | None = None,
        argsrepr: str | None = None,
    ) -> None:
        """One Celery task message (protocol 2, built by Celery's own `as_task_v2`), put
        on `queue` the way `send_task` routes it (the default exchange, the queue's name
        as routing key), persistent, and confirmed by the broker.

        Straight onto a pooled connection's channel: `send_task` would also route by name,
        ask the result backend and build an AsyncResult (diffq's results live in the job
        row), and kombu's Producer would wrap each publish in its retry machinery. A
        connection that went stale (the broker restarted) is reopened once, with the
        topology declared again; any other failure is the caller's (the relay's turn).
        """
        self._ensure_topology()
        put = self._message(
            task,
            args,
            task_id=task_id,
            priority=priority,
            time_limit=time_limit,
            soft_time_limit=soft_time_limit,
            argsrepr=argsrepr,
        )
        # Waits for a free pooled connection as send_task did: a burst larger than the
        # pool queues here rather than failing (a failure pauses publishing).
        with self.celery.pool.acquire(block=True) as conn:
            try:
                self._put(conn, queue, *put)
            except conn.recoverable_connection_errors:
                conn.close()
                self._declared = False
                self._ensure_topology()
                self._put(conn, queue, *put)

    def _message(
        self,
        task: str,
        args: list,
        *,
        task_id: str | None,
        priority: int | None,
        time_limit: float | None,
        soft_time_limit: float | None,
        argsrepr: str | None,
    ) -> tuple:
        """The message's parts as a channel's `prepare_message` takes them."""
        message = self.celery.amqp.as_task_v2(
            task_id or str(uuid.uuid4()),
            task,
            args=args,
            kwargs={},
            time_limit=time_limit,
            soft_time_limit=soft_time_limit,
            argsrepr=argsrepr,
            kwargsrepr="{}",
            ignore_result=True,
        )
        content_type, encoding, body = serialization.dumps(message.body, serializer="json")
        properties = {"delivery_mode": 2, **message.properties}
        return (body, priority, content_type, encoding, message.headers, properties)

    def _put(self, conn, queue: str, body, priority, content_type, encoding, headers, props):
        conn.ensure_connection(max_retries=1, timeout=self.timeout)
        channel = conn.default_channel
        message = channel.prepare_message(body, priority, content_type, encoding, headers, props)
        channel.basic_publish(
            message,
            exchange="",
            routing_key=queue,
            timeout=self.timeout,
            confirm_timeout=self.timeout,
        )

    def publish_webhook(self, event_id) -> bool:
        """Ask a delivery worker to attempt one webhook event; False if the broker did
        not take it (the event stays due, and the relay hands it out again)."""
        if time.monotonic() < self._paused_until:
            return False
        try:
            self._send(DELIVER_WEBHOOK_TASK, [str(event_id)], WEBHOOK_QUEUE)
        except Exception as exc:  # noqa: BLE001
            log.warning("webhook dispatch failed (%s: %s)", type(exc).__name__, exc)
            self._declared = False
            self._paused_until = time.monotonic() + self.pause_after_failure
            return False
        return True

    def publish(self, job: Job, spec: ModelSpec | None = None) -> bool:
        """Send the job's message and wait for the broker's confirm; False if it failed.

        A False leaves the row unpublished for the relay: the job is durable either way.
        """
        if time.monotonic() < self._paused_until:
            return False
        try:
            options = self._job_options(job, spec)
            self._send(GENERATE_TASK, [build_payload(job)], job.queue, **options)
        except Exception as exc:  # noqa: BLE001 - any broker failure: the relay retries
            log.warning(
                "publish of job %s failed (%s: %s); the relay will retry",
                job.id,
                type(exc).__name__,
                exc,
            )
            self._declared = False
            self._paused_until = time.monotonic() + self.pause_after_failure
            return False
        return True

    def _job_options(self, job: Job, spec: ModelSpec | None) -> dict:
        spec = spec or self.catalog.get(job.model)
        # Inside the broker's consumer_timeout for a model whose jobs span deliveries.
        timeout = self.broker.settings.broker_consumer_timeout
        soft, hard = spec.delivery_limits(timeout) if spec else (None, None)
        return {
            "task_id": str(job.id),
            "priority": job.publish_priority,
            "time_limit": hard,
            "soft_time_limit": soft,
            "argsrepr": f"job_id={job.id}",  # Flower and logs show the job id, never the prompt
        }

    def job_message(self, job: Job, spec: ModelSpec | None = None) -> tuple:
        """A job's message, exactly as `publish` sends it, for a publisher of many
        (app/broker/bulk.py): the parts a channel's `prepare_message` takes."""
        return self._message(GENERATE_TASK, [build_payload(job)], **self._job_options(job, spec))


def mark_published(session: Session, job_id: uuid.UUID) -> None:
    """Record the broker's confirm, on the database's clock. Losing this write in a crash
    only costs a harmless second publish by the relay, so it does not wait for the WAL
    flush."""
    relaxed_commit(session)
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.published_at.is_(None))
        .values(published_at=clock.now(session))
    )


def publish_and_mark(db: Database, publisher: Publisher, job: Job) -> bool:
    if not publisher.publish(job):
        return False
    with db.session() as session:
        mark_published(session, job.id)
    return True


_jobs = Job.__table__
_MARK_PUBLISHED = (
    update(_jobs)
    .where(_jobs.c.id.in_(bindparam("ids", expanding=True)), _jobs.c.published_at.is_(None))
    .values(published_at=bindparam("now"))
)
# PostgreSQL: one statement alone, its commit not waiting for the WAL flush (a lost mark
# costs a second publish); the time on the database's clock, which the stranded-delivery
# watch compares it with (app/db/clock.py, workers/stranded.py).
_MARK_PUBLISHED_PG = (
    "WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)) "
    "UPDATE jobs SET published_at = statement_timestamp() FROM relaxed "
    "WHERE id = ANY(%(ids)s::uuid[]) AND published_at IS NULL"
)


class PublishedMarks:
    """Confirmed publishes, recorded in the outbox (`published_at`) by one thread per
    process in batches: one relaxed UPDATE for every confirm of the last few
    milliseconds instead of a commit per submit. A mark that is lost (the process ends
    first, the database is away) only costs a second publish by the relay, which the
    worker's claim makes harmless; a job whose publish was not confirmed is never
    marked, so the relay always has it."""

    def __init__(self, engine: Engine, interval: float = 0.1) -> None:
        self.engine = engine
        self.interval = interval
        self._pending: list[uuid.UUID] = []
        self._lock = threading.Lock()
        self._due = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, job_id: uuid.UUID) -> None:
        with self._lock:
            self._pending.append(job_id)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="published-marks", daemon=True
                )
                self._thread.start()
                atexit.register(self.flush)
        self._due.set()

    def flush(self) -> int:
        with self._lock:
            ids, self._pending = self._pending, []
        if not ids:
            return 0
        try:
            if self.engine.dialect.name == "postgresql":
                with Session(self.engine) as session:
                    params = {"ids": [str(i) for i in ids]}
                    execute_alone(session, _MARK_PUBLISHED_PG, params)
            else:
                with self.engine.begin() as conn:
                    conn.execute(_MARK_PUBLISHED, {"ids": ids, "now": utcnow()})
        except Exception as exc:  # noqa: BLE001 - the relay publishes these again
            log.warning("marking %d confirmed publish(es) failed: %s", len(ids), exc)
        return len(ids)

    def _run(self) -> None:
        while True:
            self._due.wait()
            time.sleep(self.interval)  # gather the confirms of concurrent submits
            self._due.clear()
            self.flush()


_marks: dict[int, PublishedMarks] = {}
_marks_lock = threading.Lock()


def mark_published_soon(engine: Engine, job_id: uuid.UUID) -> None:
    """Record a confirmed publish in this process's next batch."""
    marks = _marks.get(id(engine))
    if marks is None:
        with _marks_lock:
            marks = _marks.setdefault(id(engine), PublishedMarks(engine))
    marks.add(job_id)
