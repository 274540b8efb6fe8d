"""Storing a batch's jobs in bulk and publishing them: the batch's row first, then a chunk
of jobs per statement (one transaction each), each chunk published with its confirms
awaited together (app/broker/bulk.py) while the next is stored.

- **Every job as a single submit would be:** the same row (`app/jobs/submit.py`
  `job_values`), the tenant's daily quota checked once (it is checked at submit against
  today's use, so once for all is the same check), every job counted under the tenant's
  cap on queued jobs: the batch takes a slot per job in one call under the tenant's lock
  (refused whole, 429, when they do not fit) and each chunk's statement frees its jobs'
  slots as it stores them, as a single submit's does. With a cap on jobs in flight, the
  jobs over it are stored held and the relay lets them through, as for single submits.
- **Idempotent and resumable:** a job's id is a function of the batch's id and its line
  (`line_job_id`: time-ordered like every id, in line order), and a chunk's INSERT skips
  ids already stored. A retry with the same Idempotency-Key of an ingest that died part
  way stores what is missing, and publishes only what it stored itself (the rest is
  published, or the relay publishes it).
- **The outbox rule holds:** a chunk is published only after its commit, and marked
  published only for the confirmed messages; anything else is the relay's.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import bindparam, case, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.broker.bulk import BulkPublisher
from app.broker.publish import Publisher, mark_published_soon
from app.db.models.batches import Batch
from app.db.models.jobs import Job
from app.db.models.limits import SubmitReservation
from app.db.session import execute_alone, portable_json
from app.db.types import utcnow
from app.jobs import cache
from app.jobs.submit import Caps, Refused, Submission, check_quota, job_values, json_value, row_of
from app.limits import RESERVATION_SECONDS, in_flight, lock_tenant, queued_or_reserved

CHUNK = 1000
MAX_LINES = 0xFFFF  # a line number fits the 16 bits `line_job_id` gives it
_reserved = SubmitReservation.__table__


@dataclass(frozen=True)
class BatchLine:
    """One request of a batch: valid (`submission`) or refused on its own (`error`, an
    OpenAI input file's line whose body breaks a rule: it goes to the error file)."""

    line: int  # 1-based
    custom_id: str
    submission: Submission | None = None
    error: dict[str, Any] | None = None  # {"status": 422, "code", "message", "param"}
    b64_json: bool = False  # an OpenAI images line asking for inline images


@dataclass(frozen=True)
class BatchRequest:
    endpoint: str
    lines: Sequence[BatchLine]
    completion_window: str | None = None
    window_seconds: int | None = None
    webhook: str | None = None
    metadata: dict[str, Any] | None = None
    input_file_id: uuid.UUID | None = None
    idempotency_key: str | None = None
    body_hash: str | None = None


@dataclass
class Created:
    batch: Batch
    replayed: bool = False
    stored: int = 0  # jobs this call stored
    published: int = 0  # of them, confirmed by the broker
    timings: dict[str, float] = field(default_factory=dict)


def line_job_id(batch_id: uuid.UUID, line: int) -> uuid.UUID:
    """The job id of a batch's line: the batch id's millisecond and random bits with the
    line number in the 16 bits after the version, so a batch's jobs sort in line order
    (and after every job of an earlier millisecond), and a retry of its ingest names the
    same jobs."""
    if not 0 < line <= MAX_LINES:
        raise ValueError(f"line {line} out of range")
    value = batch_id.int
    ms = value >> 80
    rand_b = value & ((1 << 58) - 1)
    out = ms << 80
    out |= 0x7 << 76
    out |= (line >> 4) << 64  # rand_a: the line's high 12 bits
    out |= 0b10 << 62
    out |= (line & 0xF) << 58  # then its low 4 bits
    out |= rand_b
    return uuid.UUID(int=out)


def line_of(job_id: uuid.UUID) -> int:
    """The line a batch's job came from (`line_job_id` read back)."""
    value = job_id.int
    return (((value >> 64) & 0xFFF) << 4) | ((value >> 58) & 0xF)


def create_batch(
    session: Session,
    publisher: Publisher,
    tenant_id: uuid.UUID,
    request: BatchRequest,
    caps: Caps,
    *,
    chunk: int = CHUNK,
    on_chunk: Callable[[int], None] | None = None,
) -> Created:
    """Store the batch and its jobs and publish them; raises Refused (409: the key was
    used with another body; 429: the quota, or the cap on queued jobs)."""
    if len(request.lines) > MAX_LINES:
        raise ValueError(f"at most {MAX_LINES} lines")
    started = time.perf_counter()
    key = request.idempotency_key
    if key:
        existing = _find_by_key(session, tenant_id, key)
        if existing is not None:
            return _replay(session, publisher, existing, request, caps, chunk)
    valid = [line for line in request.lines if line.submission is not None]
    check_quota(session, tenant_id, caps.daily_gpu_seconds)
    batch_id = _new_batch_id()
    job_ids = [line_job_id(batch_id, line.line) for line in valid]
    admitted = _reserve(session, tenant_id, job_ids, caps)
    now = utcnow()
    invalid = [
        {"line": line.line, "custom_id": line.custom_id, **(line.error or {})}
        for line in request.lines
        if line.submission is None
    ]
    batch = _batch(
        request,
        batch_id,
        tenant_id,
        now,
        status="validating",
        expires_at=now + timedelta(seconds=request.window_seconds)
        if request.window_seconds
        else None,
        total=len(request.lines),
        invalid=len(invalid),
        expired=0,
        invalid_lines=invalid or None,
        b64_json=[line.custom_id for line in request.lines if line.b64_json] or None,
        webhook_url=request.webhook,
    )
    session.add(batch)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()  # a concurrent request with the same key stored its batch first
        _release(session, job_ids)
        existing = _find_by_key(session, tenant_id, key) if key else None
        if existing is None:
            raise
        return _replay(session, publisher, existing, request, caps, chunk)
    except Exception:
        session.rollback()
        _release(session, job_ids)
        raise
    created = Created(batch)
    created.timings["validated"] = started
    _store_all(session, publisher, batch, valid, admitted, caps, created, chunk, on_chunk)
    return created


def _batch(
    request: BatchRequest, batch_id: uuid.UUID, tenant_id: uuid.UUID, now, **fields
) -> Batch:
    """A new batch row: what every batch takes from its request, and `fields`."""
    return Batch(
        id=batch_id,
        tenant_id=tenant_id,
        endpoint=request.endpoint,
        input_file_id=request.input_file_id,
        completion_window=request.completion_window,
        created_at=now,
        updated_at=now,
        client_metadata=request.metadata,
        idempotency_key=request.idempotency_key,
        request_hash=request.body_hash,
        **fields,
    )


def _new_batch_id() -> uuid.UUID:
    from app.ids import uuid7

    return uuid7()


def _find_by_key(session: Session, tenant_id: uuid.UUID, key: str) -> Batch | None:
    return session.scalar(
        select(Batch).where(Batch.tenant_id == tenant_id, Batch.idempotency_key == key)
    )


def _replay(
    session: Session,
    publisher: Publisher,
    batch: Batch,
    request: BatchRequest,
    caps: Caps,
    chunk: int,
) -> Created:
    """The same key again: the same batch (409 if the body differs). An ingest that
    did not finish (its process died) is finished now: the missing jobs are stored."""
    if batch.request_hash != request.body_hash:
        raise Refused(
            409,
            f"Idempotency-Key {batch.idempotency_key!r} was already used with a different batch.",
        )
    created = Created(batch, replayed=True)
    if batch.status == "validating":
        valid = [line for line in request.lines if line.submission is not None]
        admitted = len(valid) if caps.max_running <= 0 else 0  # held: the relay decides
        _store_all(session, publisher, batch, valid, admitted, caps, created, chunk, None)
    return created


def _reserve(session: Session, tenant_id: uuid.UUID, job_ids: list[uuid.UUID], caps: Caps) -> int:
    """A slot per job under the tenant's cap on queued jobs, taken in one transaction
    under the tenant's lock, or Refused(429) taking none; returns how many of the jobs
    go to the broker now (all, unless a cap on jobs in flight holds some back)."""
    wanted = len(job_ids)
    if caps.max_queued <= 0 and caps.max_running <= 0:
        return wanted
    now = utcnow()
    try:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text("SET LOCAL synchronous_commit = off"))
        lock_tenant(session, tenant_id)
        admitted = wanted
        if caps.max_running > 0:
            admitted = max(0, min(wanted, caps.max_running - in_flight(session, tenant_id)))
        if caps.max_queued > 0:
            since = now - timedelta(seconds=RESERVATION_SECONDS)
            taken = queued_or_reserved(session, tenant_id, since)
            if taken + wanted > caps.max_queued:
                session.rollback()
                room = max(0, caps.max_queued - taken)
                raise Refused(
                    429,
                    f"Too many queued jobs: this batch has {wanted} jobs and the tenant has "
                    f"room for {room} (at most {caps.max_queued} queued per tenant, "
                    "DIFFQ_MAX_QUEUED); wait for some to start, or send fewer.",
                    10,
                )
            session.execute(
                insert(_reserved),
                [{"job_id": j, "tenant_id": tenant_id, "created_at": now} for j in job_ids],
            )
        session.commit()
    except Refused:
        raise
    except Exception:
        session.rollback()
        raise
    return admitted


def _release(session: Session, job_ids: list[uuid.UUID]) -> None:
    """The batch was not stored: its slots are free again (else they expire)."""
    try:
        for start in range(0, len(job_ids), 5000):
            part = job_ids[start : start + 5000]
            session.execute(_reserved.delete().where(_reserved.c.job_id.in_(part)))
        session.commit()
    except Exception:  # noqa: BLE001 - the database is away; the slots expire
        session.rollback()


def _store_all(
    session: Session,
    publisher: Publisher,
    batch: Batch,
    valid: Sequence[BatchLine],
    admitted: int,
    caps: Caps,
    created: Created,
    chunk: int,
    on_chunk: Callable[[int], None] | None,
) -> None:
    tenant_id, batch_id = batch.tenant_id, batch.id
    engine = session.get_bind().engine
    specs = {line.submission.spec.name: line.submission.spec for line in valid}
    digests: dict[str, str | None] = {}
    bulk = BulkPublisher(publisher)
    refreshed = time.monotonic()
    try:
        for start in range(0, len(valid), chunk):
            part = valid[start : start + chunk]
            rows = [
                _values(session, tenant_id, batch_id, line, start + i < admitted, digests)
                for i, line in enumerate(part)
            ]
            stored = _insert(session, rows, reserved=caps.max_queued > 0)
            created.stored += len(stored)
            if "first_stored" not in created.timings:
                created.timings["first_stored"] = time.perf_counter()
            if caps.max_queued > 0 and time.monotonic() - refreshed > RESERVATION_SECONDS / 3:
                rest = valid[start + len(part) :]
                _refresh_slots(session, [line_job_id(batch_id, line.line) for line in rest])
                refreshed = time.monotonic()
            to_send = [_job(r) for r in rows if r["id"] in stored and r["admitted_at"] is not None]
            confirmed = bulk.publish(to_send, specs)
            for job_id in confirmed:
                mark_published_soon(engine, job_id)
            created.published += len(confirmed)
            if confirmed and "first_published" not in created.timings:
                created.timings["first_published"] = time.perf_counter()
            if on_chunk is not None:
                on_chunk(start + len(part))
    finally:
        bulk.close()
    now = utcnow()
    # Every line is stored: `in_progress_at` says so (a batch cancelled while its lines
    # were being stored stays cancelling, and ends only now that nothing more comes).
    session.execute(
        update(Batch)
        .where(Batch.id == batch_id)
        .values(
            status=case((Batch.status == "validating", "in_progress"), else_=Batch.status),
            in_progress_at=now,
            updated_at=now,
        )
    )
    session.commit()
    session.refresh(batch)


def _refresh_slots(session: Session, job_ids: list[uuid.UUID]) -> None:
    """A long ingest keeps its remaining slots counting (a slot older than
    RESERVATION_SECONDS stops counting: it belonged to a submit that died)."""
    for start in range(0, len(job_ids), 5000):
        part = job_ids[start : start + 5000]
        session.execute(
            _reserved.update().where(_reserved.c.job_id.in_(part)).values(created_at=utcnow())
        )
    session.commit()


def _values(
    session: Session,
    tenant_id: uuid.UUID,
    batch_id: uuid.UUID,
    line: BatchLine,
    admitted: bool,
    digests: dict[str, str | None],
) -> dict[str, Any]:
    submission = line.submission
    assert submission is not None
    cache_key = None
    if submission.seeded:  # it feeds the result cache (a batch is not answered from it)
        name = submission.spec.name
        if name not in digests:
            digests[name] = cache.model_digest(session, name)
        digest = digests[name]
        cache_key = cache.cache_key(digest, submission.request) if digest else None
    values = job_values(tenant_id, submission, cache_key)
    values["id"] = line_job_id(batch_id, line.line)
    values["batch_id"] = batch_id
    values["custom_id"] = line.custom_id
    if not admitted:
        values["admitted_at"] = None  # held: the relay lets it through (DIFFQ_MAX_RUNNING)
    return values


def _job(values: dict[str, Any]) -> Job:
    """What the publisher reads of a job (id, tenant, queue, priority, model)."""
    return cast(Job, SimpleNamespace(**values))


def _insert(session: Session, rows: list[dict[str, Any]], *, reserved: bool) -> set[uuid.UUID]:
    """One statement for the chunk, in autocommit on PostgreSQL (durable when it returns),
    freeing the chunk's slots; the ids it stored (not those stored before)."""
    if not rows:
        return set()
    stored_rows = [row_of(values) for values in rows]
    ids = [values["id"] for values in rows]
    if session.get_bind().dialect.name == "postgresql":
        sql = _insert_sql(tuple(stored_rows[0]), reserved)
        params = {
            "rows": portable_json(stored_rows, json_value),
            "ids": [str(i) for i in ids],
        }
        return {uuid.UUID(str(r[0])) for r in execute_alone(session, sql, params)}
    already = set(session.scalars(select(Job.id).where(Job.id.in_(ids))))
    fresh = [r for r in stored_rows if r["id"] not in already]
    if fresh:
        session.execute(insert(Job.__table__), fresh)
    if reserved:
        session.execute(
            _reserved.delete().where(_reserved.c.job_id.in_(bindparam("ids", expanding=True))),
            {"ids": ids},
        )
    session.commit()
    return {r["id"] for r in fresh}


@functools.cache
def _insert_sql(columns: tuple[str, ...], releasing: bool) -> str:
    names = ", ".join(f'"{name}"' for name in columns)
    statement = (
        f"INSERT INTO jobs ({names}) SELECT {names} "
        "FROM jsonb_populate_recordset(NULL::jobs, %(rows)s::jsonb) "
        "ON CONFLICT (id) DO NOTHING RETURNING id"
    )
    if not releasing:
        return statement
    return (
        "WITH released AS (DELETE FROM submit_reservations "
        "WHERE job_id = ANY(%(ids)s::uuid[])) " + statement
    )


def create_failed(
    session: Session,
    tenant_id: uuid.UUID,
    request: BatchRequest,
    errors: list[dict[str, Any]],
    total: int,
) -> Created:
    """An OpenAI input file whose lines could not be read as requests: the batch is
    stored `failed`, with `errors` naming the lines, and nothing runs (as OpenAI does)."""
    key = request.idempotency_key
    if key:
        existing = _find_by_key(session, tenant_id, key)
        if existing is not None:
            return _replay_ended(existing, request)
    now = utcnow()
    batch = _batch(
        request,
        _new_batch_id(),
        tenant_id,
        now,
        status="failed",
        finished_at=now,
        total=total,
        invalid=total,
        expired=0,
        counts={
            "total": total,
            "queued": 0,
            "running": 0,
            "succeeded": 0,
            "failed": 0,
            "canceled": 0,
            "expired": 0,
            "invalid": total,
            "pending": 0,
        },
        errors={"object": "list", "data": errors},
        webhook_url=None,
    )
    session.add(batch)
    session.commit()
    return Created(batch)


def _replay_ended(batch: Batch, request: BatchRequest) -> Created:
    if batch.request_hash != request.body_hash:
        raise Refused(
            409,
            f"Idempotency-Key {batch.idempotency_key!r} was already used with a different batch.",
        )
    return Created(batch, replayed=True)
