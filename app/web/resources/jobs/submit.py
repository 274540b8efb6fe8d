"""Making a job from a validated request: the one path behind POST /v1/jobs, replays and
the OpenAI-compatible endpoint (idempotency, result cache, caps, publish)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from flask_smorest import abort
from sqlalchemy.exc import IntegrityError

from app import usage
from app.broker.publish import publish_and_mark
from app.db.models import Job
from app.db.types import utcnow
from app.jobs import cache, service
from app.jobs.states import Priority
from app.limits import may_admit, reserve_queued_slot
from app.metrics.instruments import CACHE_HITS, JOBS_SUBMITTED
from app.web.auth import current_tenant
from app.web.services import request_session, services


@dataclass(frozen=True)
class Submitted:
    job: Job
    replayed: bool = False  # an earlier job with the same Idempotency-Key


def _idempotent(job: Job, body_hash: str | None, key: str) -> Submitted:
    if job.request_hash != body_hash:
        abort(
            409,
            message=f"Idempotency-Key {key!r} was already used with a different request body.",
        )
    return Submitted(job, replayed=True)


def submit(
    request_data: dict[str, Any],
    *,
    idempotency_key: str | None = None,
    body_hash: str | None = None,
    replay_of: uuid.UUID | None = None,
) -> Submitted:
    svc = services()
    spec, params = request_data["spec"], request_data["params"]
    session = request_session()
    tenant_id = current_tenant()
    key = idempotency_key
    if key:
        existing = service.find_by_idempotency_key(session, tenant_id, key)
        if existing is not None:
            return _idempotent(existing, body_hash, key)
    cache_key = source = None
    if request_data.get("seeded"):
        digest = cache.model_digest(session, spec.name)
        cache_key = cache.cache_key(digest, params) if digest else None
        if cache_key and request_data.get("cache", True) and replay_of is None:
            source = cache.find_cached(session, tenant_id, cache_key)
    if source is None:  # a cache hit costs no GPU time and queues nothing
        spent = usage.check_daily_quota(session, tenant_id, utcnow())
        if not spent.allowed:
            abort(
                429,
                message=f"Daily GPU quota used: {spent.used:.1f} of {spent.limit:g} GPU-seconds "
                "today (UTC); it frees at midnight UTC.",
                headers={"Retry-After": str(spent.retry_after)},
            )
        quota = reserve_queued_slot(session, tenant_id, svc.settings.max_queued)
        if not quota.allowed:
            abort(
                429,
                message=f"Too many queued jobs: at most {svc.settings.max_queued} per tenant.",
                headers={"Retry-After": str(quota.retry_after)},
            )
    admitted = source is not None or may_admit(session, tenant_id, svc.settings.max_running)
    try:
        job = service.create_job(
            session,
            tenant_id,
            model=spec.name,
            queue=spec.queue_for(params["priority"]),
            priority=Priority(params["priority"]),
            params=params,
            metadata=request_data.get("metadata"),
            deadline_seconds=request_data.get("cancel_after"),
            idempotency_key=key,
            request_hash=body_hash,
            webhook_url=request_data.get("webhook"),
            webhook_events=request_data.get("webhook_events"),
            admitted=admitted,
        )
        job.cache_key, job.replay_of = cache_key, replay_of
        if source is not None:
            session.flush()
            cache.serve_from_cache(session, job, source)
        session.commit()
    except IntegrityError:
        # A concurrent request with the same key committed first: answer with its job.
        session.rollback()
        existing = service.find_by_idempotency_key(session, tenant_id, key) if key else None
        if existing is None:
            raise
        return _idempotent(existing, body_hash, key)
    JOBS_SUBMITTED.labels(job.model).inc()
    if source is not None:
        CACHE_HITS.labels(job.model).inc()
    elif admitted:  # else it waits here until the relay lets it through
        # Committed first: a publish that fails leaves a durable row for the relay.
        publish_and_mark(svc.db, svc.publisher, job)
    return Submitted(job)
