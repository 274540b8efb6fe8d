"""The lifecycle's state changes: each a conditional UPDATE from the expected state.

Every change bumps `jobs.version`, notifies watchers on commit, and is told to the
change listeners (app/jobs/changes.py) in its own transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, func, select, text, update
from sqlalchemy.orm import Session

from app import usage
from app.db import clock
from app.db.models.jobs import Job
from app.db.session import relaxed_commit
from app.db.types import utcnow
from app.jobs import changes
from app.jobs.notify import CANCEL_CHANNEL, JOB_CHANNEL, job_changed_payload, notify
from app.jobs.results import RESULT_FILES
from app.jobs.states import ErrorCode, JobStatus
from app.kinds import job_request

# A cancel-channel payload asking a run to yield (`request_yield`), not to stop.
YIELD_PREFIX = "yield:"


def progress_of(
    stage: str, step: int = 0, total_steps: int = 0, seconds_per_step: float | None = None
) -> dict[str, Any]:
    """`seconds_per_step`: the denoising pace this delivery has measured (the worker's, from
    its second step on), given while denoising."""
    percent = round(100.0 * step / total_steps, 1) if total_steps else 0.0
    if stage in ("uploading", "done"):
        percent = 100.0
    progress = {"stage": stage, "step": step, "total_steps": total_steps, "percent": percent}
    if seconds_per_step is not None:
        progress["seconds_per_step"] = round(seconds_per_step, 4)
    return progress


def change(session: Session, job_id: uuid.UUID, *conditions: ColumnElement, **values) -> bool:
    """UPDATE the job if `conditions` hold; bump its version, notify, and tell the change
    listeners in this transaction (their writes commit with the change or not at all).
    True if it changed."""
    return _change(session, job_id, *conditions, **values) is not None


def _change(
    session: Session,
    job_id: uuid.UUID,
    *conditions: ColumnElement,
    carry_progress: bool = False,
    quiet: bool = False,
    **values,
):
    """`change`, returning the changed row's (queue, webhook_url, webhook_events,
    yield_reason, version) or None. `carry_progress`: a change of progress alone carries
    the new progress in its notification (app/jobs/notify.py); `quiet`: it sends none
    (API processes poll progress: app/web/watch.py)."""
    row = session.execute(
        update(Job)
        .where(Job.id == job_id, *conditions)
        .values(version=Job.version + 1, updated_at=clock.now(session), **values)
        .returning(Job.queue, Job.webhook_url, Job.webhook_events, Job.yield_reason, Job.version)
    ).first()
    if row is None:
        return None
    queue, webhook_url, webhook_events, _, version = row
    moved = "status" in values or "publish_priority" in values
    carried = values.get("progress") if carry_progress else None
    if not (quiet and not moved):
        notify(
            session,
            JOB_CHANNEL,
            job_changed_payload(
                job_id,
                queue,
                moved,
                version=version,
                progress=carried if isinstance(carried, dict) else None,
            ),
        )
    status = values.get("status")
    changes.emit(
        session,
        changes.JobChange(
            job_id=job_id,
            status=status if isinstance(status, JobStatus) else None,
            progressed="progress" in values,
            webhook_url=webhook_url,
            webhook_events=webhook_events,
        ),
    )
    return row


class ClaimKind(StrEnum):
    CLAIMED = "claimed"
    MISSING = "missing"  # no such job: nothing to do
    FINISHED = "finished"  # already terminal: a redelivery or a duplicate publish
    BUSY = "busy"  # running under another delivery that is still alive
    EXHAUSTED = "exhausted"  # the attempt cap is reached: dead-letter it
    EXPIRED = "expired"  # its deadline passed before it started: canceled, never run
    # Not claimed: an idle worker holds the chosen job's model, and the message goes back
    # to the queue for it (workers/hold.py); nothing was written.
    ELSEWHERE = "elsewhere"


@dataclass(frozen=True)
class Claim:
    kind: ClaimKind
    job: Job | None = None


def claim_job(
    session: Session,
    job_id: uuid.UUID,
    *,
    owner: str,
    redelivered: bool,
    max_attempts: int,
    lease_seconds: float,
    permit_id: uuid.UUID | None = None,
) -> Claim:
    """Take a job for running, or say why not.

    A `running` job is taken over only by a redelivered message: RabbitMQ redelivers
    only after the consumer that held it is gone, whereas a fresh duplicate (a second
    publish by the relay) meeting a running job means that job is in good hands.
    """
    job = session.get(Job, job_id, populate_existing=True)
    if job is None:
        return Claim(ClaimKind.MISSING)
    if job.status.terminal:
        return Claim(ClaimKind.FINISHED, job)
    if job.status == JobStatus.RUNNING and not redelivered:
        return Claim(ClaimKind.BUSY, job)
    now = utcnow()
    if job.status == JobStatus.QUEUED and job.deadline_at is not None and job.deadline_at <= now:
        cancel_expired(session, job_id)
        return Claim(ClaimKind.EXPIRED, job)
    if job.attempts >= max_attempts:
        return Claim(ClaimKind.EXHAUSTED, job)
    claimed = change(
        session,
        job_id,
        Job.status == job.status,
        Job.attempts == job.attempts,
        status=JobStatus.RUNNING,
        attempts=Job.attempts + 1,
        started_at=func.coalesce(Job.started_at, clock.now(session)),
        lease_owner=owner,
        lease_expires_at=clock.after(session, lease_seconds),
        progress=progress_of("loading", 0, job_request(job).denoise_steps),
        permit_id=permit_id,
        yield_reason=None,
    )
    if not claimed:
        return Claim(ClaimKind.BUSY, job)
    session.refresh(job)
    return Claim(ClaimKind.CLAIMED, job)


def lock_if_waiting(session: Session, job_id: uuid.UUID) -> bool:
    """Lock the job's row if it is queued and no other transaction holds it (PostgreSQL's
    SKIP LOCKED; SQLite, which has one writer at a time, only reads it): false when a
    claim, a cancel or a published mark of another transaction holds it, or it is no
    longer queued."""
    locked = session.scalar(
        select(Job.id)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED)
        .with_for_update(skip_locked=True)
    )
    return locked is not None


def run_started_by(session: Session, message_job_id: uuid.UUID) -> uuid.UUID | None:
    """The running job that the message of `message_job_id` started for fair share."""
    return session.scalar(
        select(Job.id).where(Job.permit_id == message_job_id, Job.status == JobStatus.RUNNING)
    )


def record_progress(
    session: Session,
    job_id: uuid.UUID,
    *,
    owner: str,
    progress: dict[str, Any],
    lease_seconds: float,
    progress_notify: str = "carried",
) -> Progressed:
    """Write progress and renew the lease; false if this owner no longer holds the job
    (it was canceled, or another delivery took it over), with the yield asked of it.
    `progress_notify` (DIFFQ_PROGRESS_NOTIFY): "carried", the notification carries the progress;
    "wake", it does not; "poll", none is sent (API processes read progress themselves).

    Progress is not worth a WAL flush: a crash that loses the last write loses nothing the
    next write does not restore, so the commit does not wait for the disk.
    """
    relaxed_commit(session)
    row = _change(
        session,
        job_id,
        Job.status == JobStatus.RUNNING,
        Job.lease_owner == owner,
        carry_progress=progress_notify == "carried",
        quiet=progress_notify == "poll",
        progress=progress,
        lease_expires_at=clock.after(session, lease_seconds),
    )
    return Progressed(held=row is not None, yield_reason=row[3] if row is not None else None)


@dataclass(frozen=True)
class Progressed:
    """A progress write's answer: whether the writer still holds the job (its truth value)
    and why it should go back to the queue now, if it was asked to (`request_yield`)."""

    held: bool
    yield_reason: str | None = None

    def __bool__(self) -> bool:
        return self.held


def request_yield(
    session: Session, *conditions: ColumnElement, reason: str, **values
) -> list[uuid.UUID]:
    """Ask the runs of the running jobs matching `conditions` to checkpoint and go back to
    the queue at their next step (a run that checkpoints; the others finish), writing
    `values` with the request. Their workers hear it at once (PostgreSQL NOTIFY) or with
    their next progress write."""
    ids = list(
        session.scalars(
            update(Job)
            .where(Job.status == JobStatus.RUNNING, *conditions)
            .values(yield_reason=reason, **values)
            .returning(Job.id)
        )
    )
    for job_id in ids:
        notify(session, CANCEL_CHANNEL, f"{YIELD_PREFIX}{job_id}")
    return ids


def record_checkpoint(session: Session, job_id: uuid.UUID, *, owner: str, step: int) -> bool:
    """A checkpoint of the job at `step` is stored; False if this owner no longer holds it."""
    return change(
        session,
        job_id,
        Job.status == JobStatus.RUNNING,
        Job.lease_owner == owner,
        checkpoint_step=step,
    )


def forget_checkpoint(session: Session, job_id: uuid.UUID) -> None:
    """The job's checkpoint is gone from the store (its end, or it could not be resumed)."""
    session.execute(update(Job).where(Job.id == job_id).values(checkpoint_step=None))


def finish_succeeded(
    session: Session,
    job_id: uuid.UUID,
    *,
    owner: str,
    result: dict[str, Any],
    charge: usage.Charge | None = None,
    **extra: Any,
) -> bool:
    """Record the result, and charge the tenant in the same transaction (or neither).
    `extra`: more columns to set with it (the manifest, the result cache's key)."""
    steps = result.get("steps", 0)
    now = utcnow()
    cost = {"gpu_seconds": charge.gpu_seconds, "device": charge.device} if charge else {}
    changed = change(
        session,
        job_id,
        Job.status == JobStatus.RUNNING,
        Job.lease_owner == owner,
        status=JobStatus.SUCCEEDED,
        result={name: result[name] for name in RESULT_FILES if name in result},
        progress=progress_of("done", steps, steps),
        finished_at=clock.now(session),
        lease_owner=None,
        lease_expires_at=None,
        **cost,
        **extra,
    )
    if changed and charge is not None:
        tenant_id, model = session.execute(
            select(Job.tenant_id, Job.model).where(Job.id == job_id)
        ).one()
        usage.record(session, tenant_id, model, charge, now.date())
    return changed


def finish_failed(
    session: Session,
    job_id: uuid.UUID,
    *,
    code: ErrorCode,
    message: str,
    owner: str | None = None,
) -> bool:
    """Fail a queued job, or a running one (held by `owner` when given)."""
    if owner is None:
        conditions = [Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING])]
    else:
        conditions = [Job.status == JobStatus.RUNNING, Job.lease_owner == owner]
    return change(
        session,
        job_id,
        *conditions,
        status=JobStatus.FAILED,
        error_code=code.value,
        error_message=message[:2000],
        finished_at=clock.now(session),
        lease_owner=None,
        lease_expires_at=None,
    )


class CancelOutcome(StrEnum):
    CANCELED_QUEUED = "canceled_queued"  # never reached a GPU
    CANCELED_RUNNING = "canceled_running"  # its worker stops at the next step
    ALREADY_FINISHED = "already_finished"


def cancel_job(session: Session, job: Job, *, code: ErrorCode, message: str) -> CancelOutcome:
    """Cancel a queued or running job at once; a running job's worker is told to stop."""
    was = job.status
    if was.terminal:
        return CancelOutcome.ALREADY_FINISHED
    canceled = change(
        session,
        job.id,
        Job.status == was,
        status=JobStatus.CANCELED,
        error_code=code.value,
        error_message=message,
        finished_at=clock.now(session),
        lease_owner=None,
        lease_expires_at=None,
    )
    if not canceled:
        # It moved under us; try again from its new state (at most once more per move).
        session.refresh(job)
        return cancel_job(session, job, code=code, message=message)
    if was == JobStatus.RUNNING:
        notify(session, CANCEL_CHANNEL, str(job.id))
        return CancelOutcome.CANCELED_RUNNING
    return CancelOutcome.CANCELED_QUEUED


def cancel_expired(session: Session, job_id: uuid.UUID) -> bool:
    """A job whose `cancel_after` deadline passed ends canceled/deadline: a queued one
    without running, a running one at its next step (its worker is told to stop)."""
    now = utcnow()
    for was, missed in ((JobStatus.QUEUED, "started"), (JobStatus.RUNNING, "finished")):
        running = was == JobStatus.RUNNING
        released = {"lease_owner": None, "lease_expires_at": None} if running else {}
        if change(
            session,
            job_id,
            Job.status == was,
            Job.deadline_at <= now,
            status=JobStatus.CANCELED,
            error_code=ErrorCode.DEADLINE.value,
            error_message=f"not {missed} before its cancel_after deadline",
            finished_at=clock.now(session),
            **released,
        ):
            if running:
                notify(session, CANCEL_CHANNEL, str(job_id))
            return True
    return False


def renew_lease(session: Session, job_id: uuid.UUID, *, owner: str, lease_seconds: float) -> bool:
    """Extend this owner's claim (no version bump: nothing a client sees changes)."""
    relaxed_commit(session)
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.lease_owner == owner)
        .values(lease_expires_at=clock.after(session, lease_seconds))
    )
    return result.rowcount == 1


def hand_back(
    session: Session, job_id: uuid.UUID, *, owner: str, spent_seconds: float = 0.0
) -> bool:
    """A worker shutting down, a run asked to yield (`request_yield`), or a delivery
    nearing the broker's consumer_timeout returns its unfinished job to the queue without
    spending an attempt: none is the job's fault. `spent_seconds`: the delivery's running
    seconds, added to the job's (its time budget across deliveries)."""
    return change(
        session,
        job_id,
        Job.status == JobStatus.RUNNING,
        Job.lease_owner == owner,
        status=JobStatus.QUEUED,
        attempts=Job.attempts - 1,
        spent_seconds=Job.spent_seconds + spent_seconds,
        lease_owner=None,
        lease_expires_at=None,
        progress=progress_of("queued"),
        yield_reason=None,
    )


class ReapOutcome(StrEnum):
    REQUEUED = "requeued"
    FAILED = "failed"
    SKIPPED = "skipped"  # renewed or finished in the meantime


def reap(session: Session, job: Job, *, max_attempts: int) -> ReapOutcome:
    """A running job whose lease expired lost its worker: queue it again (the relay
    republishes it) or, past the attempt cap, fail it."""
    expired = [
        Job.status == JobStatus.RUNNING,
        Job.lease_owner == job.lease_owner,
        Job.lease_expires_at < clock.now(session),
    ]
    if job.attempts >= max_attempts:
        failed = change(
            session,
            job.id,
            *expired,
            status=JobStatus.FAILED,
            error_code=ErrorCode.DEAD_LETTERED.value,
            error_message=f"its worker was lost {job.attempts} times (lease expired)",
            finished_at=clock.now(session),
            lease_owner=None,
            lease_expires_at=None,
        )
        return ReapOutcome.FAILED if failed else ReapOutcome.SKIPPED
    requeued = change(
        session,
        job.id,
        *expired,
        status=JobStatus.QUEUED,
        lease_owner=None,
        lease_expires_at=None,
        requeues=Job.requeues + 1,  # its earlier message, if it comes back, is stale
        published_at=None,
        progress=progress_of("queued"),
    )
    return ReapOutcome.REQUEUED if requeued else ReapOutcome.SKIPPED


def requeue_by_operator(session: Session, job_id: uuid.UUID, *, stuck_running: bool) -> bool:
    """An operator sends a failed job (or a queued one, or, with `stuck_running`, a
    running one whose lease expired) back to the queue with a fresh attempt budget. The
    row is left unpublished, so the relay publishes it if the caller's publish fails."""
    allowed = [Job.status.in_([JobStatus.FAILED, JobStatus.QUEUED])]
    if stuck_running:
        allowed = [
            Job.status.in_([JobStatus.FAILED, JobStatus.QUEUED])
            | ((Job.status == JobStatus.RUNNING) & (Job.lease_expires_at < clock.now(session)))
        ]
    return change(
        session,
        job_id,
        *allowed,
        status=JobStatus.QUEUED,
        attempts=0,
        error_code=None,
        error_message=None,
        finished_at=None,
        started_at=None,
        lease_owner=None,
        lease_expires_at=None,
        requeues=Job.requeues + 1,
        published_at=None,
        progress=progress_of("queued"),
    )


def cancel_many(
    session: Session,
    *conditions: ColumnElement,
    statuses: tuple[JobStatus, ...] = (JobStatus.QUEUED, JobStatus.RUNNING),
    code: ErrorCode,
    message: str,
    chunk: int = 5000,
) -> list[tuple[uuid.UUID, JobStatus]]:
    """`cancel_job` for every job that matches `conditions` and is in one of `statuses`
    (a batch's cancel, or the end of its completion window), set-wise: each a conditional
    UPDATE from the state it was read in, a chunk of jobs per statement, each bumped,
    notified and told to the change listeners; a running one's worker is told to stop.
    Returns (job id, the status it left)."""
    postgres = session.get_bind().dialect.name == "postgresql"
    pick = select(Job.id, Job.status).where(*conditions, Job.status.in_(statuses))
    if postgres:
        pick = pick.with_for_update()
    ended: list[tuple[uuid.UUID, JobStatus]] = []
    now = clock.now(session)
    found = session.execute(pick).all()
    for was in statuses:
        ids = [job_id for job_id, status in found if status == was]
        extra = {"lease_owner": None, "lease_expires_at": None} if was == JobStatus.RUNNING else {}
        for start in range(0, len(ids), chunk):
            part = ids[start : start + chunk]
            rows = session.execute(
                update(Job)
                .where(Job.id.in_(part), Job.status == was)
                .values(
                    version=Job.version + 1,
                    updated_at=now,
                    status=JobStatus.CANCELED,
                    error_code=code.value,
                    error_message=message,
                    finished_at=now,
                    **extra,
                )
                .returning(Job.id, Job.queue, Job.webhook_url, Job.webhook_events)
                .execution_options(synchronize_session=False)
            ).all()
            if postgres and rows:
                payloads = [job_changed_payload(r.id, r.queue, True) for r in rows]
                session.execute(
                    text("SELECT pg_notify(:channel, p) FROM unnest(CAST(:payloads AS text[])) p"),
                    {"channel": JOB_CHANNEL, "payloads": payloads},
                )
                if was == JobStatus.RUNNING:
                    session.execute(
                        text("SELECT pg_notify(:channel, p) FROM unnest(CAST(:ids AS text[])) p"),
                        {"channel": CANCEL_CHANNEL, "ids": [str(r.id) for r in rows]},
                    )
            for row in rows:
                changes.emit(
                    session,
                    changes.JobChange(
                        job_id=row.id,
                        status=JobStatus.CANCELED,
                        progressed=False,
                        webhook_url=row.webhook_url,
                        webhook_events=row.webhook_events,
                    ),
                )
                ended.append((row.id, was))
    return ended
