"""Which job a message starts, claimed in PostgreSQL: the run a redelivered message had
started, the fairest waiting job (weighted fair share: docs/fair-share.md), or the
message's own job.

A redelivered message means its consumer died mid-run, so it takes that run over, unless
it is stale: its job was handed back to the queue since it was published (the lease
expired and the reaper requeued it, say), and a later message of the same job may have
started a run of its own. A stale message is then only a permit, as a fresh one is: the
run it had started was already taken back, and whatever runs now is someone's live run.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models.jobs import Job
from app.db.types import utcnow
from app.jobs import fairness, transitions
from app.jobs.states import ErrorCode, JobStatus
from workers.hold import Hold
from workers.record import count_failed

if TYPE_CHECKING:
    from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)

# Tries to claim a job for one message when other workers keep taking the chosen one.
CLAIM_TRIES = 5
# Chosen jobs passed over for one message because another transaction holds their row:
# the workers of a queue all choose the same fairest job, and rather than wait for the
# winner's commit only to find the job taken, the others choose again without it
# (docs/scale.md). When every other waiting job is passed, the choice waits as before.
PASS_AT_MOST = 32


def claim_arguments(rt: WorkerRuntime, *, redelivered: bool) -> dict:
    return {
        "owner": rt.owner,
        "redelivered": redelivered,
        "max_attempts": rt.settings.max_attempts,
        "lease_seconds": rt.settings.lease_seconds,
    }


def stale(session: Session, message_job_id: uuid.UUID, requeues: int | None) -> bool:
    """Whether a message published with `requeues` is from before its job's last hand-back
    (None: a message from before the count, read as current)."""
    if requeues is None:
        return False
    now = session.scalar(select(Job.requeues).where(Job.id == message_job_id))
    return now is not None and requeues < now


def claim_for_message(
    rt: WorkerRuntime,
    session: Session,
    message_job_id: uuid.UUID,
    *,
    redelivered: bool,
    requeues: int | None = None,
) -> transitions.Claim:
    """Claim the job this message should start (see app/jobs/fairness.py). `requeues`:
    the count the message was published with (app/broker/payload.py)."""
    if redelivered and stale(session, message_job_id, requeues):
        log.info(
            "a redelivered message of job %s is stale (published before the job was handed "
            "back): a permit, taking over no run",
            message_job_id,
            extra={"job_id": str(message_job_id)},
        )
        redelivered = False
    claim_args = claim_arguments(rt, redelivered=redelivered)
    started = transitions.run_started_by(session, message_job_id) if redelivered else None
    if started is not None:  # its worker died: take the run over
        claim = transitions.claim_job(session, started, permit_id=message_job_id, **claim_args)
        if claim.kind == transitions.ClaimKind.CLAIMED:
            return claim
        if claim.kind == transitions.ClaimKind.EXHAUSTED and claim.job is not None:
            give_up(session, claim.job)
    passing: list[uuid.UUID] = []  # chosen jobs another transaction held: passed over
    hold = Hold(rt)  # jobs left to a busy worker that holds their model (workers/hold.py)
    try:
        return _claim(rt, session, message_job_id, claim_args, passing, hold)
    finally:
        hold.done()


def _claim(
    rt: WorkerRuntime,
    session: Session,
    message_job_id: uuid.UUID,
    claim_args: dict,
    passing: list[uuid.UUID],
    hold: Hold,
) -> transitions.Claim:
    tries = 0
    while tries < CLAIM_TRIES:
        session.expire_all()  # what other workers committed since the last try
        job = session.get(Job, message_job_id)
        if job is None:
            return transitions.Claim(transitions.ClaimKind.MISSING)
        # Its job ran on another job's message: this message is that job's permit.
        spare = job.status != JobStatus.QUEUED and job.permit_id is not None
        if not spare and not (rt.settings.fair_share and job.status == JobStatus.QUEUED):
            break
        if not spare and job.deadline_at is not None and job.deadline_at <= utcnow():
            break  # its own job is past its deadline: claiming it cancels it
        window = rt.settings.fair_share_window
        held = hold.condition(session)
        chosen = fairness.choose(session, job, utcnow(), window, rt.warmth(), passing, held)
        if held is not None and hold.keeps(session, job, chosen, held):
            hold.wait(session, job)
            passing.clear()  # who holds which row has changed since
            continue
        if chosen is None:  # a spare permit with nothing waiting
            kind = (
                transitions.ClaimKind.FINISHED
                if job.status.terminal
                else transitions.ClaimKind.BUSY
            )
            return transitions.Claim(kind, job)
        if hold.hands_over(session, chosen, claim_args["redelivered"]):
            return transitions.Claim(transitions.ClaimKind.ELSEWHERE, job)
        may_pass = chosen not in passing and len(passing) < PASS_AT_MOST
        if may_pass and not transitions.lock_if_waiting(session, chosen):
            passing.append(chosen)  # another worker is claiming it: choose again
            continue
        tries += 1
        if chosen == message_job_id:
            claim = transitions.claim_job(session, chosen, **claim_args)
        else:
            claim = transitions.claim_job(session, chosen, permit_id=message_job_id, **claim_args)
        if claim.kind == transitions.ClaimKind.CLAIMED:
            return claim
        if claim.kind == transitions.ClaimKind.EXHAUSTED and claim.job is not None:
            if chosen == message_job_id:
                return claim  # the caller dead-letters its own message
            give_up(session, claim.job)
        # Another worker took the chosen job first (perhaps on this job's own behalf):
        # look again, so that this message never goes unused while a job waits.
    return transitions.claim_job(session, message_job_id, **claim_args)


def give_up(session: Session, job: Job) -> None:
    """The job's attempt cap is reached: it fails, dead-lettered."""
    message = (
        f"gave up after {job.attempts} attempts: each ended without an outcome "
        "(the worker was lost or the job exceeded its hard time limit)"
    )
    if transitions.finish_failed(session, job.id, code=ErrorCode.DEAD_LETTERED, message=message):
        count_failed(job, ErrorCode.DEAD_LETTERED)
