"""Dynamic batching: one delivery of a batching model gathers compatible jobs and runs
them as one pipeline call, each job keeping its own message, seed, progress, cancel,
lease, deadline and outcome (docs/batching.md).

The delivery's own job (chosen by fair share) leads. Further messages of its queue are
taken one by one (basic.get on a channel of their own, see tasks/batching.py), up to
`max_batch - 1` of them within `max_wait_ms`: a message whose own job is queued and
compatible puts that job in the batch, its message held unacked as the job's permit; any
other message (another size, a spare permit, a redelivery) is handed back to the queue
untouched once collecting ends, for the ordinary path. Each held message is acked, or
rejected, only once its own job's outcome is recorded or handed to post-processing under
its lease, exactly as a single job's message is. A worker killed mid-batch closes the
channel: RabbitMQ redelivers every held message and each job is taken over on its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from celery.exceptions import SoftTimeLimitExceeded

from app.db.models import Job
from app.db.types import utcnow
from app.jobs import fairness, transitions
from app.jobs.payload import InvalidPayload, parse_payload
from app.jobs.states import ErrorCode, JobStatus
from app.logs import job_context
from app.metrics.instruments import BATCH_SIZE, BATCH_WAIT, WORKER_BUSY
from workers import execute
from workers.batching import compatible, generate_batch
from workers.execute import Outcome, Verdict
from workers.generation import Interrupted
from workers.lease import LeaseKeeper
from workers.pipelines import LoadedModel
from workers.progress import ProgressReporter
from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)

# How often an empty queue is asked again while a batch waits to fill.
POLL_SECONDS = 0.005


class Permit(Protocol):
    """One message taken for a batch, unacked until its job's outcome is durable."""

    payload: Any
    redelivered: bool

    def ack(self) -> None: ...

    def reject(self, requeue: bool) -> None: ...

    def pass_back(self) -> None:
        """Return an unused message to its queue, as it came (not marked redelivered)."""


class PermitSource(Protocol):
    def fetch(self) -> Permit | None:
        """The queue's next message, or None when it is empty (never blocks)."""

    def close(self) -> None: ...


@dataclass
class Member:
    job: Job
    permit: Permit | None  # None: the leader, whose message the task acks
    stop: threading.Event
    reporter: ProgressReporter | None = None
    lease: LeaseKeeper | None = None
    renew: Callable[[], bool] | None = None
    outcome: Outcome | None = None


def settle(permit: Permit, outcome: Outcome) -> None:
    """Ack or reject a member's message for its job's outcome, as the task does.

    A broker that went away meanwhile has already handed the message back (redelivered):
    its next delivery finds the job's outcome in the row, so a failed ack is only logged.
    """
    try:
        if outcome.verdict == Verdict.ACK:
            permit.ack()
        else:
            permit.reject(requeue=outcome.verdict == Verdict.REQUEUE)
    except Exception as exc:  # noqa: BLE001 - see above
        log.warning("settling a batch member's message failed (%s); it comes back", exc)


def _requeue(permit: Permit) -> None:
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
    budget = rt.models[leader.model].spec.max_pixels_per_job if leader.model in rt.models else None
    used = _pixels(leader)
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
            job = _claim_member(rt, leader, permit, room)
            if job is None:
                passed.append(permit)
            else:
                claimed.append((permit, job))
                used += _pixels(job)
    except Exception:
        # Claimed jobs keep their claim: their messages, handed back, are redelivered and
        # taken over at once (a claimed job whose message comes back redelivered is).
        for permit, _job in claimed:
            _requeue(permit)
        raise
    finally:
        for permit in passed:
            try:
                permit.pass_back()
            except Exception as exc:  # noqa: BLE001 - a closed channel hands it back itself
                log.warning("passing a message back failed (%s)", exc)
    return claimed


def _pixels(job: Job) -> int:
    params = job.input
    return int(params["width"]) * int(params["height"]) * int(params.get("num_images", 1))


def _claim_member(
    rt: WorkerRuntime, leader: Job, permit: Permit, room: int | None = None
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
        target = _member_for(rt, session, leader, own)
        if target is None or (room is not None and _pixels(target) > room):
            return None
        claim = transitions.claim_job(
            session,
            target.id,
            owner=rt.owner,
            redelivered=False,
            max_attempts=rt.settings.max_attempts,
            lease_seconds=rt.settings.lease_seconds,
            permit_id=None if target.id == own.id else own.id,
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


def _member_for(rt: WorkerRuntime, session: Any, leader: Job, own: Job) -> Job | None:
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
            where=_compatible_with(leader),
        )
    if (
        own.status == JobStatus.QUEUED
        and own.model == leader.model
        and (own.deadline_at is None or own.deadline_at > now)
        and compatible(own.input, leader.input)
    ):
        return own
    return None


def _compatible_with(leader: Job) -> Any:
    """SQL: a job that may share the leader's pipeline call (workers/batching.py)."""
    from sqlalchemy import and_

    params = leader.input
    return and_(
        Job.model == leader.model,
        Job.input["width"].as_integer() == int(params["width"]),
        Job.input["height"].as_integer() == int(params["height"]),
        Job.input["steps"].as_integer() == int(params["steps"]),
        Job.input["guidance_scale"].as_float() == float(params["guidance_scale"]),
        Job.input["scheduler"].as_string() == str(params.get("scheduler", "default")),
    )


def execute_batch(
    rt: WorkerRuntime,
    leader: Job,
    model: LoadedModel,
    open_permits: Callable[[str], PermitSource],
) -> Outcome:
    """Run the claimed `leader` with whatever compatible jobs come within max_wait_ms;
    returns the leader's outcome (its message is the task's to ack)."""
    spec = model.spec
    waited_from = time.perf_counter()
    members: list[Member] = [Member(leader, None, threading.Event())]
    try:
        source: PermitSource | None = open_permits(leader.queue)
    except Exception as exc:  # noqa: BLE001 - the job runs alone rather than not at all
        log.warning("cannot take further messages (%s); running the job alone", exc)
        source = None
    try:
        if source is not None:
            try:
                gathered = collect(
                    rt, leader, source, max_batch=spec.max_batch, max_wait=spec.max_wait_ms / 1000
                )
            except Exception as exc:
                if execute._is_database_error(exc):
                    raise
                # The broker went away while gathering: the job runs alone.
                log.warning("gathering a batch failed (%s); running the job alone", exc)
                gathered = []
            for permit, job in gathered:
                members.append(Member(job, permit, threading.Event()))
        BATCH_WAIT.labels(spec.name).observe(time.perf_counter() - waited_from)
        BATCH_SIZE.labels(spec.name).observe(len(members))
        log.info(
            "batch of %d job(s) on model %s: %s",
            len(members),
            spec.name,
            ", ".join(str(m.job.id) for m in members),
        )
        held_since = time.perf_counter()
        rt.start_job(None)
        try:
            _run_batch(rt, model, members)
        finally:
            rt.end_job()
            WORKER_BUSY.labels(rt.name).inc(time.perf_counter() - held_since)
    finally:
        # Whatever has no verdict yet (a database outage raised) goes back to the queue;
        # the lease keepers are closed and the stop flags forgotten.
        for member in members:
            rt.batch_stops.pop(member.job.id, None)
            if member.permit is not None and member.outcome is None:
                _requeue(member.permit)
        if source is not None:
            source.close()
    leader_outcome = members[0].outcome
    assert leader_outcome is not None
    return leader_outcome


def _run_batch(rt: WorkerRuntime, model: LoadedModel, members: list[Member]) -> None:
    for member in members:
        _start_member(rt, member)
    try:
        _generate(rt, model, members)
    finally:
        for member in members:
            if member.lease is not None:
                member.lease.close()
            if member.reporter is not None:
                member.reporter.close()


def _start_member(rt: WorkerRuntime, member: Member) -> None:
    job_id = member.job.id
    rt.batch_stops[job_id] = member.stop
    if rt.hand_back_requested.is_set():
        member.stop.set()

    write, renew = execute.job_writes(rt, job_id)
    member.renew = renew
    member.reporter = ProgressReporter(
        write, interval=rt.settings.progress_interval, stop=member.stop
    )
    member.lease = LeaseKeeper(
        renew, interval=rt.settings.lease_seconds / 3, stop=member.stop
    ).start()


def _decide(member: Member, outcome: Outcome) -> None:
    """Record a member's outcome and settle its message now (the leader's: the task's)."""
    member.outcome = outcome
    if member.permit is not None:
        settle(member.permit, outcome)


def _generate(rt: WorkerRuntime, model: LoadedModel, members: list[Member]) -> None:
    started = time.perf_counter()
    steps = int(members[0].job.input["steps"])
    running: list[Member] = []
    for member in members:
        assert member.reporter is not None
        if member.reporter.stage("encoding_prompt", 0, steps):
            running.append(member)
        else:
            _decide(member, Outcome(Verdict.ACK, "job no longer held before generation"))
    if not running:
        return

    def on_step(member: Member) -> Callable[[int, int], bool]:
        assert member.reporter is not None
        reporter = member.reporter

        def step(index: int, total: int) -> bool:
            if rt.hand_back_requested.is_set():
                member.stop.set()  # a shutdown stops every job of the batch
            return reporter.step(index, total)

        return step

    pipeline_started = time.perf_counter()
    try:
        outputs = generate_batch(
            model.pipeline,
            [m.job.input for m in running],
            device=model.device,
            on_step=[on_step(m) for m in running],
        )
    except Interrupted:
        outputs = [None] * len(running)
    except SoftTimeLimitExceeded:
        limit = model.spec.soft_time_limit
        for member in running:
            _decide(
                member,
                execute._fail(
                    rt,
                    member.job,
                    ErrorCode.TIMEOUT,
                    f"the job exceeded its time limit of {limit}s",
                ),
            )
        return
    except Exception as exc:
        if execute._is_database_error(exc):
            raise
        log.warning(
            "batch of %d failed (%s: %s); running its jobs one at a time",
            len(running),
            type(exc).__name__,
            (str(exc).splitlines() or [""])[0][:200],
        )
        outputs = None
    if outputs is None:
        execute._free_accelerator_memory()
        for member in running:
            _alone(rt, model, member)
        return
    generated = time.perf_counter()
    images = sum(len(o.images) for o in outputs if o is not None) or 1
    for member, output in zip(running, outputs, strict=True):
        assert member.reporter is not None and member.renew is not None
        with job_context(job_id=str(member.job.id), tenant=str(member.job.tenant_id)):
            if output is None:
                _decide(member, execute._stopped(rt, member.job, member.reporter.last_step))
                continue
            share = (generated - pipeline_started) * len(output.images) / images
            try:
                outcome = execute._store(
                    rt,
                    member.job,
                    model,
                    output,
                    member.reporter,
                    member.renew,
                    (started, generated),
                    share,
                )
            except Exception as exc:  # noqa: BLE001 - recorded in _crashed
                outcome = execute._crashed(rt, member.job, exc)
            _decide(member, outcome)


def _alone(rt: WorkerRuntime, model: LoadedModel, member: Member) -> None:
    """Run one member by itself (after its batch failed), with its own reporter."""
    assert member.reporter is not None and member.renew is not None
    with job_context(job_id=str(member.job.id), tenant=str(member.job.tenant_id)):
        outcome = execute._generate_and_store(rt, member.job, model, member.reporter, member.renew)
    _decide(member, outcome)
