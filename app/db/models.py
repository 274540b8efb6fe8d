"""Tables: tenants, their API keys, and jobs (which double as their own publish outbox)."""

from __future__ import annotations

import base64
import secrets
import uuid
from datetime import date, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Date,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.db.base import Base
from app.db.enums import JobStatus, Priority
from app.db.types import JSONType, UTCDateTime, utcnow
from app.ids import uuid7

CACHE_WHERE = "status = 'succeeded' AND data_removed_at IS NULL AND cache_key IS NOT NULL"
DEADLINE_WHERE = "deadline_at IS NOT NULL AND status IN ('queued', 'running')"


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def _enum(cls: type[StrEnum], name: str) -> Enum:
    """Enums stored by value in a VARCHAR with a CHECK (no PostgreSQL enum type to drop)."""
    return Enum(
        cls,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=16,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Standard Webhooks signing secret ("whsec_<base64>"); after a rotation the previous
    # one keeps signing too until `webhook_secret_previous_until`.
    webhook_secret: Mapped[str | None] = mapped_column(String(80), default=new_webhook_secret)
    webhook_secret_previous: Mapped[str | None] = mapped_column(String(80))
    webhook_secret_previous_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Fair share: a tenant with weight 2 gets twice the GPU time of one with weight 1
    # when both have jobs waiting on the same model pool.
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default=text("1"))
    # Quota: GPU-seconds a day (UTC); None means no quota.
    daily_gpu_seconds: Mapped[float | None] = mapped_column(Float)

    keys: Mapped[list[ApiKey]] = relationship(back_populates="tenant")


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    # The public half of the key ("dq_<key_id>_<secret>"), used to find the row.
    key_id: Mapped[str] = mapped_column(String(32), unique=True)
    # SHA-256 of the whole key, hex; the key itself is shown once and never stored.
    secret_hash: Mapped[str] = mapped_column(String(64))
    label: Mapped[str | None] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # An operator's key may also pause and resume models (`PUT /v1/models/{model}/pause`).
    operator: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    tenant: Mapped[Tenant] = relationship(back_populates="keys")


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # Newest-first listing per tenant, with and without a status filter.
        Index("ix_jobs_tenant_id_id", "tenant_id", "id"),
        Index("ix_jobs_tenant_id_status_id", "tenant_id", "status", "id"),
        # Queue position: queued jobs of a queue in delivery order.
        Index(
            "ix_jobs_queued_order",
            "queue",
            "publish_priority",
            "id",
            postgresql_where=text("status = 'queued'"),
            sqlite_where=text("status = 'queued'"),
        ),
        Index(
            "ix_jobs_running",
            "queue",
            postgresql_where=text("status = 'running'"),
            sqlite_where=text("status = 'running'"),
        ),
        # Recent successes of a model: the queue-time estimate's history.
        Index(
            "ix_jobs_model_finished",
            "model",
            "finished_at",
            postgresql_where=text("status = 'succeeded'"),
            sqlite_where=text("status = 'succeeded'"),
        ),
        # Fair share: GPU time a model pool's tenants used recently.
        Index("ix_jobs_queue_finished", "queue", "finished_at"),
        # A redelivered message finds the job it was running (fair share may run another).
        Index(
            "ix_jobs_permit",
            "permit_id",
            postgresql_where=text("status = 'running'"),
            sqlite_where=text("status = 'running'"),
        ),
        # One job per (tenant, Idempotency-Key).
        Index("uq_jobs_tenant_id_idempotency_key", "tenant_id", "idempotency_key", unique=True),
        # The relay's scan for results past their retention.
        Index(
            "ix_jobs_retention",
            "finished_at",
            postgresql_where=text("status = 'succeeded' AND data_removed_at IS NULL"),
            sqlite_where=text("status = 'succeeded' AND data_removed_at IS NULL"),
        ),
        # The relay's scan for finished jobs past the job retention (their purge).
        Index(
            "ix_jobs_finished",
            "finished_at",
            postgresql_where=text("status IN ('succeeded', 'failed', 'canceled')"),
            sqlite_where=text("status IN ('succeeded', 'failed', 'canceled')"),
        ),
        # Jobs held back by their tenant's cap on jobs in flight, per tenant.
        Index(
            "ix_jobs_held",
            "tenant_id",
            "publish_priority",
            "id",
            postgresql_where=text("admitted_at IS NULL AND status = 'queued'"),
            sqlite_where=text("admitted_at IS NULL AND status = 'queued'"),
        ),
        # The result cache: a tenant's live results by request (app/jobs/cache.py).
        Index(
            "ix_jobs_cache",
            "tenant_id",
            "cache_key",
            "finished_at",
            postgresql_where=text(CACHE_WHERE),
            sqlite_where=text(CACHE_WHERE),
        ),
        # Retention: the cached copies of a job whose images are removed.
        Index(
            "ix_jobs_cached_from",
            "cached_from",
            postgresql_where=text("cached_from IS NOT NULL"),
            sqlite_where=text("cached_from IS NOT NULL"),
        ),
        # A batch's jobs by state: its counts, its cancel, its end (app/batches).
        Index(
            "ix_jobs_batch",
            "batch_id",
            "status",
            postgresql_where=text("batch_id IS NOT NULL"),
            sqlite_where=text("batch_id IS NOT NULL"),
        ),
        # The relay's scan for rows whose publish did not happen.
        Index(
            "ix_jobs_unpublished",
            "created_at",
            postgresql_where=text("published_at IS NULL AND status = 'queued'"),
            sqlite_where=text("published_at IS NULL AND status = 'queued'"),
        ),
        # The relay's scans that must not read the history (docs/history.md): finished
        # jobs' left checkpoints (retention), queued and running jobs by deadline
        # (deadlines), waiting jobs oldest first (priority aging).
        Index(
            "ix_jobs_checkpointed",
            "status",
            postgresql_where=text("checkpoint_step IS NOT NULL"),
            sqlite_where=text("checkpoint_step IS NOT NULL"),
        ),
        Index(
            "ix_jobs_deadline",
            "deadline_at",
            postgresql_where=text(DEADLINE_WHERE),
            sqlite_where=text(DEADLINE_WHERE),
        ),
        Index(
            "ix_jobs_waiting",
            "created_at",
            "id",
            postgresql_where=text("status = 'queued' AND admitted_at IS NOT NULL"),
            sqlite_where=text("status = 'queued' AND admitted_at IS NOT NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    status: Mapped[JobStatus] = mapped_column(
        _enum(JobStatus, "job_status"), default=JobStatus.QUEUED
    )
    model: Mapped[str] = mapped_column(String(100))
    queue: Mapped[str] = mapped_column(String(200))
    priority: Mapped[Priority] = mapped_column(
        _enum(Priority, "job_priority"), default=Priority.NORMAL
    )
    # AMQP priority of the newest message for this job (aging raises it; see relay).
    publish_priority: Mapped[int] = mapped_column(SmallInteger, default=5, server_default=text("5"))
    # The normalized request, including the seed actually used.
    input: Mapped[dict[str, Any]] = mapped_column(JSONType)
    # steps x images; the queue-time estimate and the backlog charge it at the job's
    # size (app/jobs/queue_info.py: a unit is one step of one 512 x 512 image).
    work_units: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    client_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONType)
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Bumped by every change; the id of Server-Sent Events (Last-Event-ID).
    version: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    error_code: Mapped[str | None] = mapped_column(String(40))
    error_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Not started by then: canceled with reason "deadline" (the request's cancel_after).
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    # SHA-256 of the request body that first used the key.
    request_hash: Mapped[str | None] = mapped_column(String(64))
    # Outbox: NULL until the task message was confirmed by the broker.
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Who runs it and until when that claim holds without renewal.
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Where to POST events about this job, and which ("job.succeeded", …).
    webhook_url: Mapped[str | None] = mapped_column(Text)
    webhook_events: Mapped[list[str] | None] = mapped_column(JSONType)
    # Past the retention period the images are deleted and the result cleared.
    data_removed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Set when the job may go to the broker: at once, or (over its tenant's cap of jobs
    # in flight, DIFFQ_MAX_RUNNING) when the relay releases it. Held jobs stay here.
    admitted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Cost: device seconds inside the pipeline call, and the device's name.
    gpu_seconds: Mapped[float | None] = mapped_column(Float)
    device: Mapped[str | None] = mapped_column(String(100))
    # The job id of the message this run was started by, when fair share ran this job on
    # another job's message (that message's redelivery takes this run over).
    permit_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    # SHA-256 of (model weights digest, normalized input): equal keys, equal images. Set
    # only when the request may be served from, and may feed, the result cache.
    cache_key: Mapped[str | None] = mapped_column(String(64))
    # A cache hit: the job whose images this one shares (they belong to that job).
    cached_from: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    # A replay: the job whose inputs this one ran again.
    replay_of: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    # How the images were made: weights digest, scheduler, seed, dtype, device, versions.
    manifest: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # A job of a batch (POST /v1/batches): the batch, and the client's id of its line.
    batch_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    custom_id: Mapped[str | None] = mapped_column(String(256))
    # The weights the job runs on beyond its model: SHA-256 of its adapters' digests and
    # scales ("" for none; app/kinds `JobRequest.adapter_set`). A batch shares one set;
    # a worker prefers a waiting job whose set it holds warm (docs/fair-share.md).
    adapter_set: Mapped[str] = mapped_column(String(64), default="", server_default=text("''"))
    # Times this job, the fair choice, was passed over for a job whose weights the
    # worker held warm (at most DIFFQ_WARM_MAX_SKIPS).
    warm_skips: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # Times this job was handed back to the queue (its lease expired, an operator's
    # requeue, a stranded delivery): each message carries the count it was published
    # with, so that a message redelivered from before a hand-back is known as stale and
    # never takes over a run that a later message started (workers/claim.py).
    requeues: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # The step of the job's last stored checkpoint (workers/checkpoints.py), or None: a
    # worker that claims it resumes from there; removed with the checkpoint at its end.
    checkpoint_step: Mapped[int | None] = mapped_column(Integer)
    # Why the job's run should checkpoint and go back to the queue at its next step
    # ("paused": its model was paused with `now`; "preempted": an urgent job waits), or
    # None; cleared when it goes back or is claimed again (read with each progress write).
    yield_reason: Mapped[str | None] = mapped_column(String(20))
    # Times the job yielded to an urgent one (app/housekeeping/preemption.py); at most
    # DIFFQ_MAX_PREEMPTIONS, after which it runs to its end.
    preemptions: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # Running seconds its earlier deliveries spent: each hand-back adds its delivery's
    # (a lost run's time is not known, and adds nothing). For a model whose jobs span
    # deliveries, its soft_time_limit is a budget of these and the running delivery's
    # (app/catalog.py `spans_deliveries`, workers/checkpoints.py).
    spent_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default=text("0"))


class ModelPause(Base):
    """A model an operator paused (app/jobs/pauses.py): its workers stop taking its jobs
    until it is resumed; its queued jobs wait."""

    __tablename__ = "model_pauses"

    model: Mapped[str] = mapped_column(String(100), primary_key=True)
    paused_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Its running jobs were asked to checkpoint and go back to the queue (`--now`).
    now: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    reason: Mapped[str | None] = mapped_column(String(200))
    paused_by: Mapped[str | None] = mapped_column(String(100))


class HeldModel(Base):
    """A model a worker process holds loaded, as it last said (workers/models.py): a free
    worker leaves a cold job to the worker that holds its model, waiting for a busy one
    or handing the message over to an idle one (app/jobs/residency.py). Written when a
    worker's loaded set changes, its `seen_at` renewed every few seconds while the
    process lives; removed when it stops."""

    __tablename__ = "held_models"

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)  # jobs.lease_owner
    model: Mapped[str] = mapped_column(String(100), primary_key=True, index=True)
    loaded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AuthFailure(Base):
    """Failed authentications of one client address in one minute, counted by every API
    process (app/web/throttle.py): the failed-auth throttle is shared, as the rate limit
    is. Rows of past minutes are dropped as a new minute's first failure is counted."""

    __tablename__ = "auth_failures"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    window: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # epoch minute
    count: Mapped[int] = mapped_column(Integer, default=0)


class ModelDigest(Base):
    """The SHA-256 of a model's weight files, as the workers that loaded it computed."""

    __tablename__ = "model_digests"

    model: Mapped[str] = mapped_column(String(100), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class WebhookEvent(Base):
    """One event for one job's webhook: the delivery outbox. Its id is the stable
    `webhook-id` of every attempt to deliver it."""

    __tablename__ = "webhook_events"
    __table_args__ = (
        Index(
            "ix_webhook_events_due",
            "next_attempt_at",
            postgresql_where=text("state = 'pending'"),
            sqlite_where=text("state = 'pending'"),
        ),
        Index("ix_webhook_events_job_id_created_at", "job_id", "created_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    # A job's event, or (job_id null) a batch's (`batch.completed`, …).
    job_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    batch_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("batches.id", ondelete="CASCADE"), index=True
    )
    type: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The body, frozen at the first attempt so that every retry sends the same bytes.
    payload: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # pending -> delivered | failed (schedule exhausted) | gone (receiver answered 410)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Handed to a delivery worker until then; past it, the relay hands it out again.
    dispatched_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class WebhookAttempt(Base):
    """One HTTP attempt to deliver an event, as it went."""

    __tablename__ = "webhook_attempts"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    event_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("webhook_events.id", ondelete="CASCADE"), index=True
    )
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    status_code: Mapped[int | None] = mapped_column(Integer)
    latency_ms: Mapped[int | None] = mapped_column(Integer)
    # Why it did not count as delivered (refused address, timeout, status, redirect).
    error: Mapped[str | None] = mapped_column(String(300))


class RequestCount(Base):
    """Requests per API key per fixed window: a rate limit every API process shares."""

    __tablename__ = "request_counts"

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    window_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0)


class UsedTicket(Base):
    """A WebSocket ticket already spent (app/web/tickets.py): a ticket opens one socket,
    on whichever API process it is presented. Kept until the ticket expires."""

    __tablename__ = "used_tickets"
    __table_args__ = (Index("ix_used_tickets_expires_at", "expires_at"),)

    ticket_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SubmitReservation(Base):
    """A submit in progress: a slot under its tenant's queued cap, taken in a short
    transaction before the job's own and released by the job's commit. One older than
    RESERVATION_SECONDS (app/limits.py) belonged to a submit that died, and counts no
    more."""

    __tablename__ = "submit_reservations"
    __table_args__ = (
        Index("ix_submit_reservations_tenant_id_created_at", "tenant_id", "created_at"),
    )

    job_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DailyUsage(Base):
    """GPU time, jobs and images per tenant, UTC day, model and device: what usage and
    quotas read. Kept apart from jobs, so that purging old jobs keeps the accounts."""

    __tablename__ = "daily_usage"

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    model: Mapped[str] = mapped_column(String(100), primary_key=True)
    device: Mapped[str] = mapped_column(String(100), primary_key=True)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    jobs: Mapped[int] = mapped_column(Integer, default=0)
    images: Mapped[int] = mapped_column(Integer, default=0)


class Upload(Base):
    """An input image a tenant stored (`POST /v1/uploads`, or a `data:` URI in a job),
    decoded and checked at upload and kept as PNG under the tenant's prefix, addressed by
    the SHA-256 of that PNG: the same image uploaded twice is one object and one row (its
    expiry moved on). Jobs name its digest; the object stays while an unexpired upload
    or a job whose results are kept names it (app/housekeeping/retention.py)."""

    __tablename__ = "uploads"
    __table_args__ = (
        UniqueConstraint("tenant_id", "sha256", name="uq_uploads_tenant_id_sha256"),
        Index("ix_uploads_expires_at", "expires_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    sha256: Mapped[str] = mapped_column(String(64))
    width: Mapped[int] = mapped_column(Integer)
    height: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(Integer)
    # The stored PNG's mode: RGB, RGBA (the upload had transparency) or L (a mask).
    mode: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class Adapter(Base):
    """A LoRA adapter a tenant stored (`POST /v1/adapters`), checked at upload for its
    base model's family (app/adapters.py) and kept as safetensors under the tenant's
    prefix, addressed by its SHA-256. Jobs name it by id; their request keeps the digest."""

    __tablename__ = "adapters"
    __table_args__ = (UniqueConstraint("tenant_id", "sha256", name="uq_adapters_tenant_id_sha256"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    sha256: Mapped[str] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(200))
    # The model it was checked for, and that model's family (app/adapters.py FAMILIES).
    model: Mapped[str] = mapped_column(String(100))
    family: Mapped[str] = mapped_column(String(40))
    bytes: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    layers: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Batch(Base):
    """Many jobs submitted as one (POST /v1/batches): one status with counts, one cancel,
    one completion webhook, an optional completion window and result files. Its jobs are
    ordinary jobs carrying `batch_id` and their line's `custom_id` (app/batches)."""

    __tablename__ = "batches"
    __table_args__ = (
        Index("ix_batches_tenant_id_id", "tenant_id", "id"),
        Index("uq_batches_tenant_id_idempotency_key", "tenant_id", "idempotency_key", unique=True),
        # The relay's scan: batches not ended yet.
        Index(
            "ix_batches_open",
            "id",
            postgresql_where=text("finished_at IS NULL"),
            sqlite_where=text("finished_at IS NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    # validating (lines being stored) -> in_progress -> completed | expired;
    # cancelling -> cancelled | failed. "finalizing" is shown, not stored (app/batches).
    status: Mapped[str] = mapped_column(String(16))
    # What each line is: "/v1/jobs" (a job request) or an OpenAI endpoint's request.
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    completion_window: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    in_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Past it, the batch's jobs not started yet end canceled/expired.
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancelling_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finalizing_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    total: Mapped[int] = mapped_column(Integer)  # lines, refused ones included
    invalid: Mapped[int] = mapped_column(Integer, default=0)  # refused lines (no job)
    expired: Mapped[int] = mapped_column(Integer, default=0)  # jobs ended by the window
    # Counts per outcome, frozen when the batch ended (read from its jobs before).
    counts: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    output_file_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    error_file_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    # Why the batch failed: OpenAI's {"object": "list", "data": [{code, message, line}]}.
    errors: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # Lines refused one by one (an OpenAI input file's): [{line, custom_id, status, error}].
    invalid_lines: Mapped[list[Any] | None] = mapped_column(JSONType, deferred=True)
    # custom_ids of OpenAI lines that asked for `response_format: b64_json`.
    b64_json: Mapped[list[str] | None] = mapped_column(JSONType, deferred=True)
    client_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONType)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))


class BatchFile(Base):
    """A file of the Files API: a batch's input a tenant uploaded (kept in the result
    store), or a batch's output or error file (rendered from its jobs when read)."""

    __tablename__ = "files"
    __table_args__ = (Index("ix_files_tenant_id_id", "tenant_id", "id"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid7)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    purpose: Mapped[str] = mapped_column(String(32))  # batch | batch_output | batch_error
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    storage_key: Mapped[str | None] = mapped_column(Text)  # an upload's object
    batch_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)  # an output's batch
