"""Gathering a batch: up to `max_batch - 1` further compatible jobs for a batching model's
claimed job, each on its own message (docs/batching.md).

Further messages of the job's queue are taken one by one (the broker backend's
`permits`: basic.get on a channel of their own), within `max_wait_ms`: a message whose
own job is queued and compatible puts that job in the batch, its message held unacked
as the job's permit; any other message (another size, a spare permit, a redelivery) is
handed back to the queue untouched once gathering ends, for the ordinary path. A worker
killed mid-batch closes the channel: RabbitMQ redelivers every held message and each
job is taken over on its own.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import and_, false, func

from app.addons import BY_BATCH_FIELD
from app.broker.payload import InvalidPayload, parse_payload
from app.db.models.jobs import Job
from app.db.types import utcnow
from app.jobs import fairness, transitions
from app.jobs.states import JobStatus
from app.kinds import EARLIER_DEFAULTS, JobRequest, compatible, job_request, kind_of
from workers.claim import claim_arguments
from workers.outcome import Permit

if TYPE_CHECKING:
    from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)

# How often an empty queue is asked again while a batch waits to fill.
POLL_SECONDS = 0.005


class PermitSource(Protocol):
    def fetch(self) -> Permit | None:
        """The queue's next message, or None when it is empty (never blocks)."""

    def close(self) -> None: ...


def requeue(permit: Permit) -> None:
    try:
        permit.reject(requeue=True)
    except Exception as exc:  # noqa: BLE001 - a closed channel hands it back by itself
        log.warning("handing a batch member's message back failed (%s)", exc)


def collect(
    rt: WorkerRuntime,
    leader: Job,
    source: PermitSource,
    *,
    max_batch: int,
    max_wait: float,
) -> list[tuple[Permit, Job]]:
    """Up to max_batch - 1 claimed jobs, each with its own message; others go back."""
    claimed: list[tuple[Permit, Job]] = []
    passed: list[Permit] = []
    # The claimed jobs' leases are renewed only once the batch runs: gathering must end
    # well inside one lease.
    ends = time.monotonic() + min(max_wait, rt.settings.lease_seconds / 3)
    # One call must fit where one job must: its images together within max_pixels_per_job.
    model = rt.models.get(leader.model)
    budget = model.spec.max_pixels_per_job if model is not None else None
    request = job_request(leader)
    used = request.pixels
    try:
        # At most max_batch messages held at once, the leader's included.
        while len(claimed) + len(passed) < max_batch - 1:
            permit = source.fetch()
            if permit is None:
                left = ends - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(POLL_SECONDS, left))
                continue
            room = None if budget is None else budget - used
            job = _claim_member(rt, leader, request, permit, room)
            if job is None:
                passed.append(permit)
            else:
                claimed.append((permit, job))
                used += job_request(job).pixels
    except Exception:
        # Claimed jobs keep their claim: their messages, handed back, are redelivered and
        # taken over at once (a claimed job whose message comes back redelivered is).
        for permit, _job in claimed:
            requeue(permit)
        raise
    finally:
        for permit in passed:
            try:
                permit.pass_back()
            except Exception as exc:  # noqa: BLE001 - a closed channel hands it back itself
                log.warning("passing a message back failed (%s)", exc)
    return claimed


def _claim_member(
    rt: WorkerRuntime, leader: Job, request: JobRequest, permit: Permit, room: int | None
) -> Job | None:
    """Claim a job for the leader's batch on this message, or None (the message goes back).

    The message is a permit, as in the ordinary path (docs/fair-share.md): with fair share
    on, it starts the fairest *compatible* waiting job of its priority (its own job when
    that is its tenant's turn), that job's own message becoming a spare permit; without
    fair share, only its own job, if compatible. The job must fit in `room` pixels.
    """
    if permit.redelivered:
        return None  # its run may need taking over: the ordinary path knows how
    try:
        payload = parse_payload(permit.payload)
    except InvalidPayload:
        return None  # the ordinary path dead-letters it
    with rt.db.session() as session:
        own = session.get(Job, payload.job_id)
        if own is None or own.queue != leader.queue:
            return None
        target = _member_for(rt, session, leader, request, own)
        if target is None or (room is not None and job_request(target).pixels > room):
            return None
        claim = transitions.claim_job(
            session,
            target.id,
            permit_id=None if target.id == own.id else own.id,
            **claim_arguments(rt, redelivered=False),
        )
        if claim.kind != transitions.ClaimKind.CLAIMED:
            return None
        assert claim.job is not None
        log.info(
            "job %s claimed (attempt %d), joining the batch of job %s%s",
            claim.job.id,
            claim.job.attempts,
            leader.id,
            "" if target.id == own.id else f", on the message of job {own.id} (fair share)",
            extra={"job_id": str(claim.job.id), "tenant": str(claim.job.tenant_id)},
        )
        return claim.job


def _member_for(
    rt: WorkerRuntime, session: Any, leader: Job, request: JobRequest, own: Job
) -> Job | None:
    now = utcnow()
    waiting = own.status == JobStatus.QUEUED and own.published_at is not None
    spare = own.status != JobStatus.QUEUED and own.permit_id is not None
    if rt.settings.fair_share and (waiting or spare):
        return fairness.fairest(
            session,
            own.queue,
            own.publish_priority,
            now,
            rt.settings.fair_share_window,
            prefer=own.tenant_id if waiting else None,
            where=compatible_sql(leader.model, request),
        )
    if (
        own.status == JobStatus.QUEUED
        and own.model == leader.model
        and (own.deadline_at is None or own.deadline_at > now)
        and compatible(job_request(own), request)
    ):
        return own
    return None


def compatible_sql(model: str, request: JobRequest) -> Any:
    """SQL: a stored job that may share this request's pipeline call (its kind's batch
    fields equal; a field a row of an earlier version lacks reads as its default then)."""
    clauses = [Job.model == model]
    for name in kind_of(request).batch_fields:
        if name == "model":
            continue
        addon = BY_BATCH_FIELD.get(name)
        if addon is not None and addon.column:  # a column of its own (adapter_set)
            clauses.append(getattr(Job, name) == getattr(request, name))
            continue
        if addon is not None:  # a job with some runs in a call of its own
            none = Job.input[addon.field].as_string().is_(None)
            clauses.append(none if not getattr(request, addon.field) else false())
            continue
        value = getattr(request, name)
        element = Job.input[name]
        if isinstance(value, bool) or not isinstance(value, int | float):
            stored = element.as_string() if isinstance(value, str) else element.as_boolean()
        elif isinstance(value, float):
            stored = element.as_float()
        else:
            stored = element.as_integer()
        if name in EARLIER_DEFAULTS:
            stored = func.coalesce(stored, EARLIER_DEFAULTS[name])
        clauses.append(stored == value)
    return and_(*clauses)
