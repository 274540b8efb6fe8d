"""Recording a job's outcome and its progress in PostgreSQL, riding out a database restart.

Every write here is a conditional UPDATE on a job this worker holds (app/jobs/
transitions.py): a run that lost its claim (canceled, taken over, reaped) records
nothing, and its verdict says so. A write the database refuses for its content (a
`DataError`: a value it cannot store) would fail the same way on every retry and every
run: the job ends at once, failed with `outcome_refused`, instead of going back through
lease expiry three times.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.exc import DataError, DBAPIError, OperationalError
from sqlalchemy.orm import Session
from tenacity import Retrying, retry_if_exception_type, stop_before_delay, wait_exponential

from app.db.models.jobs import Job
from app.jobs import transitions
from app.jobs.states import ErrorCode
from app.metrics.instruments import GENERATION_DURATION, JOBS_FINISHED, STEP_DURATION
from workers.outcome import HandBack, Outcome, Verdict

if TYPE_CHECKING:
    from app.catalog import ModelSpec
    from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)
T = TypeVar("T")


def record(rt: WorkerRuntime, write: Callable[[Session], T]) -> T:
    """Write an outcome, riding out a database restart for up to DIFFQ_DB_RETRY seconds.

    The images are already in the store by then; regenerating them because PostgreSQL
    restarted would waste a GPU run. If the database stays away, the error propagates and
    the task hands the message back rather than ack an unrecorded outcome.
    """
    for attempt in Retrying(
        retry=retry_if_exception_type(OperationalError),
        wait=wait_exponential(multiplier=0.5, max=5.0),  # 0.5 s, 1, 2, 4, then 5 s apart
        stop=stop_before_delay(rt.settings.db_retry_seconds),  # no sleep past the deadline
        before_sleep=lambda state: log.warning(
            "database unavailable (%s); retrying in %.1fs",
            type(state.outcome.exception()).__name__,
            state.upcoming_sleep,
        ),
        reraise=True,
    ):
        with attempt, rt.db.session() as session:
            return write(session)
    raise AssertionError("not reached: the last attempt returns or raises")


def fail(rt: WorkerRuntime, job: Job, code: ErrorCode, message: str) -> Outcome:
    recorded = record(
        rt,
        lambda session: transitions.finish_failed(
            session, job.id, code=code, message=message, owner=rt.owner
        ),
    )
    if not recorded:
        # Someone else owns the job now (or it was canceled): their outcome stands.
        return Outcome(Verdict.DISCARD, f"{code} not recorded: job no longer held")
    log.warning("job %s failed: %s: %s", job.id, code, message, extra={"job_id": str(job.id)})
    count_failed(job, code)
    return Outcome(Verdict.DEAD_LETTER, f"{code}: {message}")


def count_failed(job: Job | None, code: ErrorCode) -> None:
    model = job.model if job is not None else "unknown"
    JOBS_FINISHED.labels(model, "failed", code.value).inc()


def refused(rt: WorkerRuntime, job: Job, exc: DataError) -> Outcome:
    """The database refused the outcome's content: a retry would be refused alike."""
    detail = (str(exc.orig).splitlines() or [type(exc.orig).__name__])[0][:200]
    log.error("job %s: the database refused its outcome: %s", job.id, detail)
    return fail(rt, job, ErrorCode.OUTCOME_REFUSED, f"the database refused the outcome: {detail}")


def succeed(
    rt: WorkerRuntime,
    job: Job,
    files: dict[str, list[dict[str, Any]]],
    steps: int,
    outcome: dict[str, Any],
    timing: tuple[float, float],
    progress_writes: int,
) -> Outcome:
    """Record a job's files (uploaded: `images`, and a clip's `videos`), its charge,
    manifest and cache key."""
    started, generated = timing
    try:
        recorded = record(
            rt,
            lambda session: transitions.finish_succeeded(
                session,
                job.id,
                owner=rt.owner,
                result={**files, "steps": steps},
                **outcome,
            ),
        )
    except DataError as exc:
        return refused(rt, job, exc)
    elapsed = time.perf_counter() - started
    if not recorded:
        log.warning("job %s finished but is no longer held; result not recorded", job.id)
        return Outcome(Verdict.DISCARD, "finished but no longer held")
    JOBS_FINISHED.labels(job.model, "succeeded", "").inc()
    GENERATION_DURATION.labels(job.model, str(steps)).observe(generated - started)
    STEP_DURATION.labels(job.model).observe((generated - started) / max(1, steps))
    log.info(
        "job %s succeeded in %.3fs (generate %.3fs, encode+upload %.3fs, %d progress writes)",
        job.id,
        elapsed,
        generated - started,
        elapsed - (generated - started),
        progress_writes,
        extra={"job_id": str(job.id)},
    )
    return Outcome(Verdict.ACK, "succeeded")


def stopped(rt: WorkerRuntime, job: Job, step: int) -> Outcome:
    """The run stopped at a step: handed back (a shutdown, a yield, its delivery near the
    broker's consumer_timeout), or no longer ours. A hand-back adds the delivery's
    running seconds to the job's (`spent_seconds`)."""
    extra = {"job_id": str(job.id)}
    reason = rt.hand_back_reason(job.id)
    if reason is not None:
        ran = rt.delivery_seconds()
        handed = record(
            rt, lambda s: transitions.hand_back(s, job.id, owner=rt.owner, spent_seconds=ran)
        )
        if handed:
            routine = reason == HandBack.CONSUMER_TIMEOUT  # by design, every so often
            log.log(
                logging.INFO if routine else logging.WARNING,
                "job %s handed back at step %s: %s (%s; this delivery ran %.1fs)",
                job.id,
                step,
                reason.said,
                reason.value,
                ran,
                extra=extra,
            )
            return Outcome(Verdict.REQUEUE, f"handed back: {reason.said}")
    # Canceled, taken over by a redelivery, or reaped: the row already says which.
    log.info("job %s stopped at step %s: no longer held (canceled?)", job.id, step, extra=extra)
    return Outcome(Verdict.DISCARD, "stopped: job no longer held")


def timed_out(rt: WorkerRuntime, job: Job, spec: ModelSpec) -> Outcome:
    message = f"the job exceeded its time limit of {spec.soft_time_limit}s"
    return fail(rt, job, ErrorCode.TIMEOUT, message)


def over_time(rt: WorkerRuntime, job: Job, spec: ModelSpec, step: int) -> Outcome:
    """Its soft time limit came: Celery's for this delivery, or its budget across
    deliveries (workers/checkpoints.py BudgetSpent). A job whose delivery's limit is below
    its model's own (app/catalog.py `delivery_limits`) goes back to the queue while its
    budget lasts, to resume from its last checkpoint; otherwise it fails with `timeout`."""
    left = spec.soft_time_limit - (job.spent_seconds or 0.0) - rt.delivery_seconds()
    delivery_soft, _ = spec.delivery_limits(rt.settings.broker_consumer_timeout)
    if delivery_soft < spec.soft_time_limit and left > 0:
        rt.yield_job(job.id, HandBack.TIME_LIMIT)
        return stopped(rt, job, step)
    return timed_out(rt, job, spec)


def crashed(rt: WorkerRuntime, job: Job, exc: Exception) -> Outcome:
    """Called inside the except clause (log.exception shows the traceback)."""
    if isinstance(exc, ValueError):
        return fail(rt, job, ErrorCode.INVALID_INPUT, f"the pipeline refused the input: {exc}")
    if isinstance(exc, DataError):
        return refused(rt, job, exc)
    if isinstance(exc, DBAPIError):
        raise exc  # the task hands the message back: the outcome could not be recorded
    log.exception("job %s crashed", job.id, extra={"job_id": str(job.id)})
    return fail(rt, job, ErrorCode.INTERNAL, f"internal error ({type(exc).__name__})")


def job_writes(
    rt: WorkerRuntime, job_id: uuid.UUID
) -> tuple[Callable[[dict[str, Any]], bool], Callable[[], bool]]:
    """The progress write and the lease renewal of a job this worker holds; each answers
    False once the job is no longer held (canceled, taken over, reaped). A progress write
    also hears a request to yield (app/jobs/pauses.py)."""

    def write(progress: dict[str, Any]) -> bool:
        with rt.db.session() as session:
            written = transitions.record_progress(
                session,
                job_id,
                owner=rt.owner,
                progress=progress,
                lease_seconds=rt.settings.lease_seconds,
                progress_notify=rt.settings.progress_notify,
            )
        if written.yield_reason is not None:  # heard here where no NOTIFY told it first
            rt.yield_job(job_id, written.yield_reason)
        return written.held

    def renew() -> bool:
        with rt.db.session() as session:
            return transitions.renew_lease(
                session, job_id, owner=rt.owner, lease_seconds=rt.settings.lease_seconds
            )

    return write, renew
