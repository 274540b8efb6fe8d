"""The dead-letter queues, for operators: read without losing, requeue, purge.

Messages are taken with basic.get and left unacknowledged while they are looked at; the
ones an operation does not consume go back to their DLQ when the channel closes, in
their order. A message is acknowledged (removed) only after its job's row says what
happened to it: requeued (and republished), or failed. The job row stays the truth:
a requeue resets it to `queued` with a fresh attempt budget and leaves it unpublished
until the broker confirms the new message, so a crash in between is repaired by the
relay like any other unpublished job.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kombu import Connection, Queue

from app.broker.backend import Broker, Unsupported
from app.broker.publish import Publisher, publish_and_mark
from app.broker.topology import dead_letter_queue_name
from app.db.models.jobs import Job
from app.db.session import Database
from app.jobs import transitions
from app.jobs.states import ErrorCode, JobStatus


@dataclass
class DeadLetter:
    """One message in a DLQ, with what its x-death header and its job's row say."""

    queue: str  # the work queue it died in
    message: Any = field(repr=False)
    job_id: uuid.UUID | None = None
    tenant: str | None = None
    death_reason: str = "unknown"  # RabbitMQ's: rejected, expired, delivery_limit
    deaths: int = 0
    died_at: datetime | None = None
    status: str | None = None  # the job's, or None when the row is gone
    attempts: int | None = None
    error: str | None = None  # the job's error code and message

    def age_seconds(self, now: datetime | None = None) -> float | None:
        if self.died_at is None:
            return None
        return ((now or datetime.now(UTC)) - self.died_at).total_seconds()

    def as_dict(self) -> dict[str, Any]:
        age = self.age_seconds()
        return {
            "job_id": str(self.job_id) if self.job_id else None,
            "tenant": self.tenant,
            "queue": self.queue,
            "death_reason": self.death_reason,
            "deaths": self.deaths,
            "age_seconds": round(age, 1) if age is not None else None,
            "status": self.status,
            "attempts": self.attempts,
            "error": self.error,
        }


@dataclass(frozen=True)
class Selection:
    """Which dead letters an operation takes: all, some job ids, or an error code."""

    everything: bool = False
    job_ids: frozenset[uuid.UUID] = frozenset()
    error_code: str | None = None

    def __post_init__(self) -> None:
        if not (self.everything or self.job_ids or self.error_code):
            raise ValueError("select dead letters by job id, by error code, or all of them")

    def matches(self, letter: DeadLetter) -> bool:
        if self.everything:
            return True
        if self.job_ids and letter.job_id in self.job_ids:
            return True
        code = (letter.error or "").split(":", 1)[0]
        return bool(self.error_code) and code == self.error_code


@dataclass(frozen=True)
class Action:
    job_id: uuid.UUID | None
    queue: str
    outcome: str  # requeued, purged, skipped: <why>


def _death(headers: dict[str, Any]) -> tuple[str, int, datetime | None]:
    deaths = headers.get("x-death") or []
    if not deaths:
        return "unknown", 0, None
    latest = deaths[0]
    when = latest.get("time")
    if isinstance(when, datetime) and when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    reason = latest.get("reason", "unknown")
    if isinstance(reason, bytes):
        reason = reason.decode()
    return str(reason), int(latest.get("count", 1)), when if isinstance(when, datetime) else None


def _parse(queue: str, message: Any) -> DeadLetter:
    headers = message.headers or {}
    reason, deaths, died_at = _death(headers)
    letter = DeadLetter(queue, message, death_reason=reason, deaths=deaths, died_at=died_at)
    try:
        args = message.decode()[0]
        payload = args[0] if args else {}
        letter.job_id = uuid.UUID(str(payload.get("job_id") or headers.get("id")))
        letter.tenant = str(payload.get("tenant")) if payload.get("tenant") else None
    except Exception:  # noqa: BLE001 - a broken message is still listed (and purgeable)
        try:
            letter.job_id = uuid.UUID(str(headers.get("id")))
        except ValueError:
            letter.job_id = None
    return letter


def dead_letters(
    broker: Broker, connect: Callable[[], Connection], db: Database, queues: Iterable[str]
) -> DeadLetters:
    """The dead-letter queues of `queues` for operators; `Unsupported` where the broker
    keeps none (its `features`)."""
    if not broker.features.dead_letters:
        raise Unsupported(f"the {broker.name} broker keeps no dead letters")
    return DeadLetters(connect, db, queues)


class DeadLetters:
    def __init__(self, connect: Callable[[], Connection], db: Database, queues: Iterable[str]):
        self._connect = connect
        self.db = db
        self.queues = list(queues)

    @contextmanager
    def _browse(self) -> Iterator[list[DeadLetter]]:
        """Every dead letter, held unacknowledged; what is not acked goes back on exit."""
        with self._connect() as conn:
            channel = conn.channel()
            try:
                letters: list[DeadLetter] = []
                for queue in self.queues:
                    dlq = Queue(dead_letter_queue_name(queue), no_declare=True)(channel)
                    while (message := dlq.get(no_ack=False, accept=["json"])) is not None:
                        letters.append(_parse(queue, message))
                self._attach_rows(letters)
                yield letters
            finally:
                channel.close()  # unacknowledged messages return to their queues

    def _attach_rows(self, letters: list[DeadLetter]) -> None:
        ids = [letter.job_id for letter in letters if letter.job_id]
        if not ids:
            return
        with self.db.session() as session:
            rows = {job.id: job for job in session.query(Job).filter(Job.id.in_(ids))}
        for letter in letters:
            job = rows.get(letter.job_id)
            if job is None:
                continue
            letter.status = job.status.value
            letter.attempts = job.attempts
            if job.error_code:
                letter.error = f"{job.error_code}: {job.error_message or ''}".strip()
            if letter.tenant is None:
                letter.tenant = str(job.tenant_id)

    def list(self, limit: int | None = None) -> list[DeadLetter]:
        with self._browse() as letters:
            return letters[:limit] if limit else letters

    def requeue(self, selection: Selection, publisher: Publisher) -> list[Action]:
        actions = []
        with self._browse() as letters:
            for letter in filter(selection.matches, letters):
                actions.append(self._requeue_one(letter, publisher))
        return actions

    def _requeue_one(self, letter: DeadLetter, publisher: Publisher) -> Action:
        if letter.job_id is None or letter.status is None:
            return Action(letter.job_id, letter.queue, "skipped: no job row (purge it)")
        if letter.status in (JobStatus.SUCCEEDED.value, JobStatus.CANCELED.value):
            return Action(letter.job_id, letter.queue, f"skipped: job {letter.status} (purge it)")
        with self.db.session() as session:
            moved = transitions.requeue_by_operator(session, letter.job_id, stuck_running=False)
            job = session.get(Job, letter.job_id)
        if not moved or job is None:
            return Action(letter.job_id, letter.queue, f"skipped: job {letter.status}")
        published = publish_and_mark(self.db, publisher, job)
        letter.message.ack()  # the row is queued again: the relay republishes if need be
        return Action(
            letter.job_id, letter.queue, "requeued" if published else "requeued (relay publishes)"
        )

    def purge(self, selection: Selection) -> list[Action]:
        actions = []
        with self._browse() as letters:
            for letter in filter(selection.matches, letters):
                if letter.job_id is not None:
                    with self.db.session() as session:
                        transitions.finish_failed(
                            session,
                            letter.job_id,
                            code=ErrorCode.DEAD_LETTERED,
                            message="removed from the dead-letter queue by an operator",
                        )
                letter.message.ack()
                actions.append(Action(letter.job_id, letter.queue, "purged"))
        return actions
