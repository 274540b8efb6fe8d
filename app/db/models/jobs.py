"""Jobs, which double as their own publish outbox."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    Uuid,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, partial_index
from app.db.enums import JobStatus, Priority
from app.db.types import JSONType, UTCDateTime, utcnow
from app.ids import uuid7

CACHE_WHERE = "status = 'succeeded' AND data_removed_at IS NULL AND cache_key IS NOT NULL"


DEADLINE_WHERE = "deadline_at IS NOT NULL AND status IN ('queued', 'running')"


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


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # Newest-first listing per tenant, with and without a status filter.
        Index("ix_jobs_tenant_id_id", "tenant_id", "id"),
        Index("ix_jobs_tenant_id_status_id", "tenant_id", "status", "id"),
        # Queue position: queued jobs of a queue in delivery order.
        partial_index(
            "ix_jobs_queued_order", "queue", "publish_priority", "id", where="status = 'queued'"
        ),
        partial_index("ix_jobs_running", "queue", where="status = 'running'"),
        # Recent successes of a model: the queue-time estimate's history.
        partial_index(
            "ix_jobs_model_finished", "model", "finished_at", where="status = 'succeeded'"
        ),
        # Fair share: GPU time a model pool's tenants used recently.
        Index("ix_jobs_queue_finished", "queue", "finished_at"),
        # A redelivered message finds the job it was running (fair share may run another).
        partial_index("ix_jobs_permit", "permit_id", where="status = 'running'"),
        # One job per (tenant, Idempotency-Key).
        Index("uq_jobs_tenant_id_idempotency_key", "tenant_id", "idempotency_key", unique=True),
        # The relay's scan for results past their retention.
        partial_index(
            "ix_jobs_retention",
            "finished_at",
            where="status = 'succeeded' AND data_removed_at IS NULL",
        ),
        # The relay's scan for finished jobs past the job retention (their purge).
        partial_index(
            "ix_jobs_finished", "finished_at", where="status IN ('succeeded', 'failed', 'canceled')"
        ),
        # Jobs held back by their tenant's cap on jobs in flight, per tenant.
        partial_index(
            "ix_jobs_held",
            "tenant_id",
            "publish_priority",
            "id",
            where="admitted_at IS NULL AND status = 'queued'",
        ),
        # The result cache: a tenant's live results by request (app/jobs/cache.py).
        partial_index("ix_jobs_cache", "tenant_id", "cache_key", "finished_at", where=CACHE_WHERE),
        # Retention: the cached copies of a job whose images are removed.
        partial_index("ix_jobs_cached_from", "cached_from", where="cached_from IS NOT NULL"),
        # A batch's jobs by state: its counts, its cancel, its end (app/batches).
        partial_index("ix_jobs_batch", "batch_id", "status", where="batch_id IS NOT NULL"),
        # The relay's scan for rows whose publish did not happen.
        partial_index(
            "ix_jobs_unpublished", "created_at", where="published_at IS NULL AND status = 'queued'"
        ),
        # The relay's scans that must not read the history (docs/history.md): finished
        # jobs' left checkpoints (retention), queued and running jobs by deadline
        # (deadlines), waiting jobs oldest first (priority aging).
        partial_index("ix_jobs_checkpointed", "status", where="checkpoint_step IS NOT NULL"),
        partial_index("ix_jobs_deadline", "deadline_at", where=DEADLINE_WHERE),
        partial_index(
            "ix_jobs_waiting",
            "created_at",
            "id",
            where="status = 'queued' AND admitted_at IS NOT NULL",
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
