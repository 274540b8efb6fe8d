"""One delivery of a job message, from claim to recorded outcome; no Celery objects here."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session
from tenacity import Retrying, retry_if_exception_type, stop_before_delay, wait_exponential

from app import usage
from app.broker.topology import DEAD_LETTER_EXCHANGE, JOBS_EXCHANGE, dead_letter_queue_name
from app.db.models import Job
from app.db.types import utcnow
from app.jobs import fairness, transitions
from app.jobs.cache import cache_key
from app.jobs.payload import GENERATE_TASK, InvalidPayload, build_payload, parse_payload
from app.jobs.states import ErrorCode, JobStatus
from app.logs import job_context
from app.metrics.instruments import (
    GENERATION_DURATION,
    JOBS_FINISHED,
    STEP_DURATION,
    WORKER_BUSY,
)
from app.storage import StorageUnavailable, image_key
from app.storage.retry import put_with_retry
from workers.encoding import encode_image
from workers.generation import Generation, Interrupted, generate, job_scheduler
from workers.lease import LeaseKeeper
from workers.manifest import job_manifest
from workers.pipelines import LoadedModel, device_name
from workers.progress import ProgressReporter
from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)
T = TypeVar("T")


# Tries to claim a job for one message when other workers keep taking the chosen one.
CLAIM_TRIES = 5


class Verdict(StrEnum):
    ACK = "ack"  # done with this message: the row says what happened
    DEAD_LETTER = "dead_letter"  # reject without requeue: the DLQ keeps it for operators
    REQUEUE = "requeue"  # handed back unfinished (shutdown): another worker takes it


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    reason: str


def execute_job(
    rt: WorkerRuntime,
    raw_payload: Any,
    *,
    redelivered: bool,
    open_permits: Callable[[str], Any] | None = None,
) -> Outcome:
    """Run the job this message starts. `open_permits(queue)` (a workers.batch.PermitSource
    factory), where given, lets a batching model's job take further compatible messages
    of its queue into one pipeline call (docs/batching.md)."""
    try:
        payload = parse_payload(raw_payload)
    except InvalidPayload as exc:
        if exc.job_id is not None:
            with rt.db.session() as session:
                if transitions.finish_failed(
                    session, exc.job_id, code=ErrorCode.INVALID_MESSAGE, message=str(exc)
                ):
                    _count_failed(session.get(Job, exc.job_id), ErrorCode.INVALID_MESSAGE)
        log.error("dead-lettering a broken message: %s", exc)
        return Outcome(Verdict.DEAD_LETTER, f"invalid message: {exc}")

    with rt.db.session() as session:
        claim = _claim(rt, session, payload.job_id, redelivered=redelivered)
        kind = claim.kind
        if kind == transitions.ClaimKind.EXHAUSTED:
            assert claim.job is not None
            _give_up(session, claim.job)
    job_id = claim.job.id if claim.job is not None else payload.job_id
    log_extra = {"job_id": str(job_id), "tenant": str(payload.tenant)}
    if claim.job is not None:
        log_extra["attempt"] = str(claim.job.attempts)
    if kind == transitions.ClaimKind.EXHAUSTED:
        log.error("job %s dead-lettered: attempt cap reached", job_id, extra=log_extra)
        return Outcome(Verdict.DEAD_LETTER, "attempt cap reached")
    if kind != transitions.ClaimKind.CLAIMED:
        status = claim.job.status.value if claim.job is not None else "absent"
        log.info("job %s not run: %s (%s)", job_id, kind, status, extra=log_extra)
        return Outcome(Verdict.ACK, f"{kind}: {status}")
    assert claim.job is not None
    log.info(
        "job %s claimed (attempt %d%s%s)",
        claim.job.id,
        claim.job.attempts,
        ", redelivered" if redelivered else "",
        f", on the message of job {payload.job_id} (fair share)"
        if job_id != payload.job_id
        else "",
        extra=log_extra,
    )
    model = rt.models.get(claim.job.model)
    if open_permits is not None and model is not None and batchable(model.spec, claim.job):
        from workers.batch import execute_batch

        with job_context(**log_extra):
            return execute_batch(rt, claim.job, model, open_permits)
    rt.start_job(claim.job.id)
    held_since = time.perf_counter()
    try:
        with job_context(**log_extra):
            return _run(rt, claim.job)
    finally:
        rt.end_job()
        WORKER_BUSY.labels(rt.name).inc(time.perf_counter() - held_since)


def batchable(spec: Any, job: Job) -> bool:
    """Whether this job may gather others into a batch (its model batches at its size)."""
    return spec.batches(int(job.input["width"]), int(job.input["height"]))


def _claim(
    rt: WorkerRuntime, session: Session, message_job_id: uuid.UUID, *, redelivered: bool
) -> transitions.Claim:
    """Claim the job this message should start (see app/jobs/fairness.py): the run that a
    redelivered message had started, a fairer tenant's waiting job, or its own job."""
    claim_args = {
        "owner": rt.owner,
        "redelivered": redelivered,
        "max_attempts": rt.settings.max_attempts,
        "lease_seconds": rt.settings.lease_seconds,
    }
    started = transitions.run_started_by(session, message_job_id) if redelivered else None
    if started is not None:  # its worker died: take the run over
        claim = transitions.claim_job(session, started, permit_id=message_job_id, **claim_args)
        if claim.kind == transitions.ClaimKind.CLAIMED:
            return claim
        if claim.kind == transitions.ClaimKind.EXHAUSTED and claim.job is not None:
            _give_up(session, claim.job)
    for _ in range(CLAIM_TRIES):
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
        chosen = fairness.choose(session, job, utcnow(), rt.settings.fair_share_window)
        if chosen is None:  # a spare permit with nothing waiting
            kind = (
                transitions.ClaimKind.FINISHED
                if job.status.terminal
                else transitions.ClaimKind.BUSY
            )
            return transitions.Claim(kind, job)
        if chosen == message_job_id:
            claim = transitions.claim_job(session, chosen, **claim_args)
        else:
            claim = transitions.claim_job(session, chosen, permit_id=message_job_id, **claim_args)
        if claim.kind == transitions.ClaimKind.CLAIMED:
            return claim
        if claim.kind == transitions.ClaimKind.EXHAUSTED and claim.job is not None:
            if chosen == message_job_id:
                return claim  # the caller dead-letters its own message
            _give_up(session, claim.job)
        # Another worker took the chosen job first (perhaps on this job's own behalf):
        # look again, so that this message never goes unused while a job waits.
    return transitions.claim_job(session, message_job_id, **claim_args)


def _give_up(session: Session, job: Job) -> None:
    message = (
        f"gave up after {job.attempts} attempts: each ended without an outcome "
        "(the worker was lost or the job exceeded its hard time limit)"
    )
    if transitions.finish_failed(session, job.id, code=ErrorCode.DEAD_LETTERED, message=message):
        _count_failed(job, ErrorCode.DEAD_LETTERED)


def _record(rt: WorkerRuntime, write: Callable[[Session], T]) -> T:
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


def _fail(rt: WorkerRuntime, job: Job, code: ErrorCode, message: str) -> Outcome:
    recorded = _record(
        rt,
        lambda session: transitions.finish_failed(
            session, job.id, code=code, message=message, owner=rt.owner
        ),
    )
    if not recorded:
        # Someone else owns the job now (or it was canceled): their outcome stands.
        return Outcome(Verdict.ACK, f"{code} not recorded: job no longer held")
    log.warning("job %s failed: %s: %s", job.id, code, message, extra={"job_id": str(job.id)})
    _count_failed(job, code)
    return Outcome(Verdict.DEAD_LETTER, f"{code}: {message}")


def _count_failed(job: Job | None, code: ErrorCode) -> None:
    model = job.model if job is not None else "unknown"
    JOBS_FINISHED.labels(model, "failed", code.value).inc()


def job_writes(
    rt: WorkerRuntime, job_id: uuid.UUID
) -> tuple[Callable[[dict[str, Any]], bool], Callable[[], bool]]:
    """The progress write and the lease renewal of a job this worker holds; each answers
    False once the job is no longer held (canceled, taken over, reaped)."""

    def write(progress: dict[str, Any]) -> bool:
        with rt.db.session() as session:
            return transitions.record_progress(
                session,
                job_id,
                owner=rt.owner,
                progress=progress,
                lease_seconds=rt.settings.lease_seconds,
            )

    def renew() -> bool:
        with rt.db.session() as session:
            return transitions.renew_lease(
                session, job_id, owner=rt.owner, lease_seconds=rt.settings.lease_seconds
            )

    return write, renew


def _run(rt: WorkerRuntime, job: Job) -> Outcome:
    model = rt.models.get(job.model)
    if model is None:
        return _fail(
            rt, job, ErrorCode.MODEL_UNAVAILABLE, f"this worker does not serve model {job.model!r}"
        )

    write, renew = job_writes(rt, job.id)
    reporter = ProgressReporter(
        write, interval=rt.settings.progress_interval, stop=rt.stop_requested
    )
    lease = LeaseKeeper(
        renew, interval=rt.settings.lease_seconds / 3, stop=rt.stop_requested
    ).start()
    try:
        return _generate_and_store(rt, job, model, reporter, renew)
    finally:
        lease.close()
        reporter.close()


def _generate_and_store(
    rt: WorkerRuntime,
    job: Job,
    model: LoadedModel,
    reporter: ProgressReporter,
    renew: Callable[[], bool],
) -> Outcome:
    params = job.input
    steps = int(params["steps"])
    started = time.perf_counter()
    try:
        if not reporter.stage("encoding_prompt", 0, steps):
            return Outcome(Verdict.ACK, "job no longer held before generation")
        pipeline_started = time.perf_counter()
        output = generate(model.pipeline, params, device=model.device, on_step=reporter.step)
        generated = time.perf_counter()
        return _store(
            rt,
            job,
            model,
            output,
            reporter,
            renew,
            (started, generated),
            generated - pipeline_started,
        )
    except Interrupted:
        return _stopped(rt, job, reporter.last_step)
    except SoftTimeLimitExceeded:
        limit = model.spec.soft_time_limit
        return _fail(rt, job, ErrorCode.TIMEOUT, f"the job exceeded its time limit of {limit}s")
    except Exception as exc:  # noqa: BLE001 (recorded: gpu_oom below, others in _crashed)
        if not _is_out_of_memory(exc):
            return _crashed(rt, job, exc)
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        log.warning("job %s ran out of memory: %s", job.id, first_line[:200])
    # Out of memory. Only here, once the except clause has dropped the traceback (whose
    # frames pin the activations), can the memory go back: freeing it inside the clause
    # would keep the peak allocated and fail the next job too. gpu_oom is dead-lettered,
    # never retried with the same parameters.
    _free_accelerator_memory()
    return _fail(rt, job, ErrorCode.GPU_OOM, "out of memory; retry with a smaller size or batch")


def _store(
    rt: WorkerRuntime,
    job: Job,
    model: LoadedModel,
    output: Generation,
    reporter: ProgressReporter,
    renew: Callable[[], bool],
    timing: tuple[float, float],
    gpu_seconds: float,
) -> Outcome:
    """Record a generated job: encode, upload and record it inline or hand it over.

    `gpu_seconds` is the job's share of the pipeline call (all of it, unless batched).
    """
    params = job.input
    steps = int(params["steps"])
    outcome = {
        "charge": usage.Charge(gpu_seconds, device_name(model.device), len(output.images)),
        "manifest": job_manifest(
            model.manifest or {},
            job_scheduler(model.pipeline, params.get("scheduler", "default")),
            int(params["seed"]),
        ),
        # The cache key from the weights this worker ran, not the ones the API assumed.
        "cache_key": cache_key(model.digest, params) if job.cache_key and model.digest else None,
    }
    if all(output.nsfw):
        return _fail(
            rt,
            job,
            ErrorCode.CONTENT_FILTERED,
            "the model's safety checker blacked out every image",
        )
    if rt.postprocessor is None:
        reporter.stage("uploading", steps, steps)
        return _finish(rt, job, output, outcome, (*timing, reporter.writes))
    return _finish_later(rt, job, output, outcome, timing, reporter, renew)


def _finish(
    rt: WorkerRuntime, job: Job, output: Generation, outcome: dict[str, Any], timing: tuple
) -> Outcome:
    """Encode, upload and record a generated job (inline, or on the post-processing thread)."""
    params = job.input
    try:
        uploaded = _encode_and_upload(rt, job, output.images, params)
    except StorageUnavailable as exc:
        return _fail(rt, job, ErrorCode.STORAGE_UNAVAILABLE, str(exc))
    except Exception as exc:  # noqa: BLE001 (recorded in _crashed)
        return _crashed(rt, job, exc)
    for entry, flagged in zip(uploaded, output.nsfw, strict=True):
        if flagged:
            entry["nsfw_filtered"] = True  # a black image, not what was asked for
    return _succeeded(rt, job, uploaded, int(params["steps"]), outcome, *timing)


def _finish_later(
    rt: WorkerRuntime,
    job: Job,
    output: Generation,
    outcome: dict[str, Any],
    timing: tuple,
    reporter: ProgressReporter,
    renew: Callable[[], bool],
) -> Outcome:
    """Hand the finished job to the post-processing thread; the GPU is free at once.

    The message is acked when this returns. Until the outcome is recorded, a lease keeper
    of its own (not tied to the next job's stop flag) keeps the job's lease alive; if this
    process dies first, the lease runs out and the relay requeues the job.
    """
    assert rt.postprocessor is not None
    lease = LeaseKeeper(
        renew, interval=rt.settings.lease_seconds / 3, stop=threading.Event()
    ).start()
    context = {"job_id": str(job.id), "tenant": str(job.tenant_id), "attempt": str(job.attempts)}

    steps = int(job.input["steps"])

    def work() -> Outcome:
        try:
            with job_context(**context):
                # Even the stage write is off the GPU's path.
                reporter.stage("uploading", steps, steps)
                finished = _finish(rt, job, output, outcome, (*timing, reporter.writes))
                if finished.verdict == Verdict.DEAD_LETTER:
                    _dead_letter_copy(job, finished.reason)
                return finished
        finally:
            lease.close()

    rt.postprocessor.submit(work)
    return Outcome(Verdict.ACK, "generated; encode, upload and record handed over")


def _dead_letter_copy(job: Job, reason: str) -> None:
    """A job that fails after the hand-over (its message already acked) gets the dead
    letter the inline path would have left, with RabbitMQ's x-death shape, so operators
    list and requeue it the same way (`celery -A tasks dlq`)."""
    from celery import current_app

    death = {
        "reason": "rejected",
        "count": 1,
        "queue": job.queue,
        "exchange": JOBS_EXCHANGE.name,
        "routing-keys": [job.queue],
        "time": datetime.now(UTC).replace(microsecond=0),
    }
    try:
        current_app.send_task(
            GENERATE_TASK,
            args=[build_payload(job)],
            task_id=str(job.id),
            exchange=DEAD_LETTER_EXCHANGE.name,
            routing_key=dead_letter_queue_name(job.queue),
            headers={"x-death": [death]},
            argsrepr=f"job_id={job.id}",
            kwargsrepr="{}",
            retry=True,
        )
    except Exception:
        log.exception("job %s failed (%s); its dead letter could not be written", job.id, reason)


def _crashed(rt: WorkerRuntime, job: Job, exc: Exception) -> Outcome:
    """Called inside the except clause (log.exception shows the traceback)."""
    if isinstance(exc, ValueError):
        return _fail(rt, job, ErrorCode.INVALID_INPUT, f"the pipeline refused the input: {exc}")
    if _is_database_error(exc):
        raise exc  # the task hands the message back: the outcome could not be recorded
    log.exception("job %s crashed", job.id, extra={"job_id": str(job.id)})
    return _fail(rt, job, ErrorCode.INTERNAL, f"internal error ({type(exc).__name__})")


def _succeeded(
    rt: WorkerRuntime,
    job: Job,
    uploaded: list[dict[str, Any]],
    steps: int,
    outcome: dict[str, Any],
    started: float,
    generated: float,
    progress_writes: int,
) -> Outcome:
    recorded = _record(
        rt,
        lambda session: transitions.finish_succeeded(
            session,
            job.id,
            owner=rt.owner,
            result={"images": uploaded, "steps": steps},
            **outcome,
        ),
    )
    elapsed = time.perf_counter() - started
    if not recorded:
        log.warning("job %s finished but is no longer held; result not recorded", job.id)
        return Outcome(Verdict.ACK, "finished but no longer held")
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


def _stopped(rt: WorkerRuntime, job: Job, step: int) -> Outcome:
    """The run stopped at a step: handed back for a shutdown, or no longer ours."""
    extra = {"job_id": str(job.id)}
    if rt.hand_back_requested.is_set():
        handed = _record(rt, lambda s: transitions.hand_back(s, job.id, owner=rt.owner))
        if handed:
            log.warning(
                "job %s handed back at step %s: worker shutting down", job.id, step, extra=extra
            )
            return Outcome(Verdict.REQUEUE, "handed back: worker shutting down")
    # Canceled, taken over by a redelivery, or reaped: the row already says which.
    log.info("job %s stopped at step %s: no longer held (canceled?)", job.id, step, extra=extra)
    return Outcome(Verdict.ACK, "stopped: job no longer held")


def _encode_and_upload(
    rt: WorkerRuntime, job: Job, images: list[Any], params: dict[str, Any]
) -> list[dict[str, Any]]:
    settings = rt.settings
    results = []
    for index, image in enumerate(images):
        encoded = encode_image(image, params["output_format"])
        key = image_key(job.tenant_id, job.id, index, encoded.extension)
        put_with_retry(
            rt.storage,
            key,
            encoded.data,
            encoded.content_type,
            retries=settings.upload_retries,
            backoff=settings.upload_backoff,
            backoff_max=settings.upload_backoff_max,
        )
        results.append(
            {
                "key": key,
                "width": encoded.width,
                "height": encoded.height,
                "seed": int(params["seed"]) + index,
                "content_type": encoded.content_type,
                "bytes": len(encoded.data),
                "sha256": hashlib.sha256(encoded.data).hexdigest(),
            }
        )
    return results


# Allocation failures that surface as a plain RuntimeError (cuBLAS/cuDNN handles and
# workspaces, older torch builds): they heal like torch.OutOfMemoryError.
_OOM_MARKERS = (
    "out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
    "HIP out of memory",
)


def _is_out_of_memory(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MARKERS)


def _free_accelerator_memory() -> None:
    """Collect what the failed run left (frames in reference cycles), then hand the
    allocator's cached blocks back so the next job starts from a clean pool."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _is_database_error(exc: BaseException) -> bool:
    from sqlalchemy.exc import DBAPIError

    return isinstance(exc, DBAPIError)
