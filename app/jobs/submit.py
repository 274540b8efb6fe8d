"""Submitting a job: the one mechanism behind POST /v1/jobs, replays and the
OpenAI-compatible endpoint.

One transaction makes the job durable with everything that decides about it: the
idempotency key (a unique index), the daily GPU-second quota and the jobs-in-flight cap.
The queued-job cap is a slot reserved just before (one database call that takes and
drops the tenant's lock inside PostgreSQL) and released by the job's own commit, so a
burst never overshoots the cap and no tenant lock spans a durable commit; a slot whose
submit died expires. With a jobs-in-flight cap the count runs under the tenant's lock in
the job's transaction instead. After the commit the message is published with a
confirm; the confirm is recorded in the outbox by a background batch (`app/broker/
publish.py`), and a publish that failed, or whose record was lost, is the relay's.
Queue position and ETA are not computed here: the job's GET and its events carry them.
docs/submit.md says why.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import inspect, select
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from app import usage
from app.broker.publish import Publisher, mark_published_soon
from app.catalog import ModelSpec
from app.db.models.jobs import Job
from app.db.session import execute_alone, portable_json
from app.db.types import utcnow
from app.ids import uuid7
from app.jobs import cache, service
from app.jobs.states import JobStatus, Priority
from app.jobs.transitions import progress_of
from app.kinds import JobRequest
from app.limits import (
    admit_new,
    lock_tenant,
    over_queued_cap,
    release_slot,
    reserve_queued_slot,
)
from app.metrics.instruments import CACHE_HITS, JOBS_SUBMITTED

_INSERT = Job.__table__.insert()
_UNSET = dict.fromkeys(attr.key for attr in inspect(Job).column_attrs)


@dataclass(frozen=True)
class Submission:
    """A validated request: the model's entry, the typed request (app/kinds) and what the
    submit itself is asked (metadata, deadline, webhook, cache, idempotency)."""

    spec: ModelSpec
    request: JobRequest
    metadata: dict[str, Any] | None = None
    cancel_after: int | None = None  # seconds
    webhook: str | None = None
    webhook_events: list[str] | None = None
    cache: bool = True  # may a cached result answer it
    seeded: bool = False  # the client chose the seed (only then can the cache answer)
    idempotency_key: str | None = None
    body_hash: str | None = None  # of the request body that used the key
    replay_of: uuid.UUID | None = None


@dataclass(frozen=True)
class Caps:
    """The tenant's limits at submit."""

    max_queued: int  # queued jobs per tenant; 0: no cap
    max_running: int  # jobs in flight per tenant; over it a job is held; 0: no cap
    daily_gpu_seconds: float | None  # GPU-seconds a UTC day; None: no quota


@dataclass(frozen=True)
class Submitted:
    job: Job
    replayed: bool = False  # an earlier job with the same Idempotency-Key


class Refused(Exception):
    """The request is refused: 409 (key reused with another body) or 429 (quota, cap)."""

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after


def submit_job(
    session: Session,
    publisher: Publisher,
    tenant_id: uuid.UUID,
    submission: Submission,
    caps: Caps,
    *,
    release: Callable[[], None] | None = None,
) -> Submitted:
    """Make the job durable and queue it; raises Refused. Commits `session`; `release`,
    if given, is called once the session is no longer needed, before the publish (the
    API hands its connection back to the pool rather than hold it through the broker's
    confirm)."""
    key = submission.idempotency_key
    if key:
        existing = service.find_by_idempotency_key(session, tenant_id, key)
        if existing is not None:
            return _replayed(existing, submission)
    cache_key = source = None
    if submission.seeded:
        digest = cache.model_digest(session, submission.spec.name)
        cache_key = cache.cache_key(digest, submission.request) if digest else None
        if cache_key and submission.cache and submission.replay_of is None:
            source = cache.find_cached(session, tenant_id, cache_key)
    if source is None:  # a cache hit costs no GPU time and queues nothing
        _check_quota(session, tenant_id, caps.daily_gpu_seconds)
    values = _job_values(tenant_id, submission, cache_key)
    engine = session.get_bind().engine
    try:
        if source is not None:
            job = _serve_from_cache(session, values, source)
        else:
            job = _insert_queued(session, tenant_id, values, caps)
        session.commit()
    except IntegrityError:
        # A concurrent request with the same key committed first: answer with its job.
        session.rollback()
        _release_after_failure(session, values["id"], caps)
        existing = service.find_by_idempotency_key(session, tenant_id, key) if key else None
        if existing is None:
            raise
        return _replayed(existing, submission)
    except Refused:
        raise  # nothing stored, nothing reserved
    except Exception:
        session.rollback()
        _release_after_failure(session, values["id"], caps)
        raise
    if release is not None:
        release()
    JOBS_SUBMITTED.labels(job.model).inc()
    if source is not None:
        CACHE_HITS.labels(job.model).inc()
    elif job.admitted_at is not None and publisher.publish(job, submission.spec):
        # Committed first: a publish that fails leaves a durable row for the relay.
        mark_published_soon(engine, job.id)
    return Submitted(job)


def _release_after_failure(session: Session, job_id: uuid.UUID, caps: Caps) -> None:
    """The job was not stored: free its slot now (else it expires on its own)."""
    if caps.max_queued <= 0 or caps.max_running > 0:
        return  # no slot was reserved
    try:
        release_slot(session, job_id)
        session.commit()
    except Exception:  # noqa: BLE001 - the database is away; the slot expires
        session.rollback()


def _replayed(job: Job, submission: Submission) -> Submitted:
    if job.request_hash != submission.body_hash:
        raise Refused(
            409,
            f"Idempotency-Key {submission.idempotency_key!r} was already used with a different "
            "request body.",
        )
    return Submitted(job, replayed=True)


def _check_quota(session: Session, tenant_id: uuid.UUID, limit: float | None) -> None:
    spent = usage.check_daily_quota(session, tenant_id, utcnow(), limit)
    if not spent.allowed:
        raise Refused(
            429,
            f"Daily GPU quota used: {spent.used:.1f} of {spent.limit:g} GPU-seconds today "
            "(UTC); it frees at midnight UTC.",
            spent.retry_after,
        )


def _job_values(tenant_id: uuid.UUID, submission: Submission, cache_key: str | None) -> dict:
    request, now = submission.request, utcnow()
    priority = Priority(request.priority)
    return {
        "id": uuid7(),
        "created_at": now,
        "updated_at": now,
        "tenant_id": tenant_id,
        "status": JobStatus.QUEUED,
        "model": submission.spec.name,
        "queue": submission.spec.queue_for(priority),
        "priority": priority,
        "publish_priority": priority.amqp,
        "input": request.stored(),
        "work_units": request.work_units,
        "adapter_set": request.adapter_set,
        "warm_skips": 0,
        "requeues": 0,
        "preemptions": 0,
        "spent_seconds": 0.0,
        "client_metadata": submission.metadata,
        "progress": progress_of("queued", 0, request.denoise_steps),
        "attempts": 0,
        "version": 0,
        "deadline_at": now + timedelta(seconds=submission.cancel_after)
        if submission.cancel_after
        else None,
        "idempotency_key": submission.idempotency_key,
        "request_hash": submission.body_hash,
        "webhook_url": submission.webhook,
        "webhook_events": submission.webhook_events,
        "admitted_at": now,
        "cache_key": cache_key,
        "replay_of": submission.replay_of,
    }


def _insert_queued(session: Session, tenant_id: uuid.UUID, values: dict, caps: Caps) -> Job:
    """The job's INSERT, after its slot under the queued cap was reserved; with an
    in-flight cap, that count under the tenant's lock, held until the commit."""
    if caps.max_running > 0:  # this cap's count and its answer share the job's commit
        session.execute(_INSERT, _row(values))
        lock_tenant(session, tenant_id)
        over = over_queued_cap(session, tenant_id, caps.max_queued)
        if not over.allowed:
            session.rollback()
            raise _too_many(caps, over)
        if not admit_new(session, tenant_id, values["id"], caps.max_running):
            values["admitted_at"] = None  # held: the relay lets it through later
    else:
        slot = reserve_queued_slot(session, tenant_id, values["id"], caps.max_queued)
        if not slot.allowed:
            raise _too_many(caps, slot)
        _store_releasing(session, values, reserved=caps.max_queued > 0)
    return _as_stored(values)


def _as_stored(values: dict) -> Job:
    """The job as its INSERT stored it: every attribute of the mapped class, the columns
    the INSERT left out as NULL. A plain object, not attached to any session: building a
    mapped instance (the ORM's instrumentation of every attribute) costs more than
    rendering the 202 from it."""
    return cast(Job, SimpleNamespace(**{**_UNSET, **values}))


def _store_releasing(session: Session, values: dict, *, reserved: bool) -> None:
    """The job's INSERT, freeing its slot. PostgreSQL: one statement in autocommit, so the
    job is durable when it returns, after one round trip; elsewhere, the caller's
    commit makes it so."""
    row = _row(values)
    if session.get_bind().dialect.name == "postgresql":
        sql = _insert_sql(tuple(row), reserved)
        params = {"row": portable_json(row, _json_value), "released": str(values["id"])}
        try:
            execute_alone(session, sql, params)
        except DBAPIError as lost:
            if not lost.connection_invalidated:
                raise
            _store_again(session, sql, params, values["id"])
        return
    session.execute(_INSERT, row)
    if reserved:
        release_slot(session, values["id"])


def _store_again(session: Session, sql: str, params: dict, job_id: uuid.UUID) -> None:
    """The connection was lost with the job's statement sent, so it may have committed:
    a 503 could then name a job that runs, and the client's retry would make a second.
    Sent again on a fresh connection, the statement stores the job, or fails because the
    first one did: then the job is there, and the submit goes on."""
    session.rollback()
    try:
        execute_alone(session, sql, params)
    except IntegrityError:
        session.rollback()
        if session.scalar(select(Job.id).where(Job.id == job_id)) is None:
            raise
        session.commit()


@functools.cache
def _insert_sql(columns: tuple[str, ...], releasing: bool) -> str:
    """The job's INSERT in the driver's SQL: the row as one JSON document that PostgreSQL
    spreads over the named columns (`jsonb_populate_record` converts each value to its
    column's type); with `releasing`, the DELETE of the submit's slot in the same
    statement."""
    names = ", ".join(f'"{name}"' for name in columns)
    insert = (
        f"INSERT INTO jobs ({names}) SELECT {names} "
        "FROM jsonb_populate_record(NULL::jobs, %(row)s::jsonb)"
    )
    if not releasing:
        return insert
    return (
        "WITH released AS (DELETE FROM submit_reservations WHERE job_id = %(released)s::uuid) "
        + insert
    )


def _json_value(value: Any) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a job column value")


def _row(values: dict) -> dict:
    return {("metadata" if name == "client_metadata" else name): v for name, v in values.items()}


def _too_many(caps: Caps, verdict) -> Refused:
    return Refused(
        429,
        f"Too many queued jobs: at most {caps.max_queued} per tenant.",
        verdict.retry_after,
    )


def _serve_from_cache(session: Session, values: dict, source: Job) -> Job:
    job = Job(**values)
    session.add(job)
    session.flush()
    cache.serve_from_cache(session, job, source)
    return job


# What a batch's bulk ingest (app/batches/ingest.py) shares with a single submit: a
# queued job's values, the daily quota's check, the row and its JSON values.
job_values = _job_values
check_quota = _check_quota
row_of = _row
json_value = _json_value
