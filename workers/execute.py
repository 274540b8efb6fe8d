"""One delivery of a job message, from claim to recorded outcome; no Celery objects here."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app.db.models import Job
from app.jobs import transitions
from app.jobs.cache import cache_key
from app.jobs.payload import InvalidPayload, parse_payload
from app.jobs.states import ErrorCode
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
from workers.generation import Interrupted, generate_images, job_scheduler
from workers.lease import LeaseKeeper
from workers.manifest import job_manifest
from workers.pipelines import LoadedModel
from workers.progress import ProgressReporter
from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)
T = TypeVar("T")


class Verdict(StrEnum):
    ACK = "ack"  # done with this message: the row says what happened
    DEAD_LETTER = "dead_letter"  # reject without requeue: the DLQ keeps it for operators
    REQUEUE = "requeue"  # handed back unfinished (shutdown): another worker takes it


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    reason: str
    generated: bool = False


def execute_job(rt: WorkerRuntime, raw_payload: Any, *, redelivered: bool) -> Outcome:
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
        claim = transitions.claim_job(
            session,
            payload.job_id,
            owner=rt.owner,
            redelivered=redelivered,
            max_attempts=rt.settings.max_attempts,
            lease_seconds=rt.settings.lease_seconds,
        )
        kind = claim.kind
        if kind == transitions.ClaimKind.EXHAUSTED:
            assert claim.job is not None
            message = (
                f"gave up after {claim.job.attempts} attempts: each ended without an outcome "
                "(the worker was lost or the job exceeded its hard time limit)"
            )
            if transitions.finish_failed(
                session, payload.job_id, code=ErrorCode.DEAD_LETTERED, message=message
            ):
                _count_failed(claim.job, ErrorCode.DEAD_LETTERED)
    log_extra = {"job_id": str(payload.job_id), "tenant": str(payload.tenant)}
    if claim.job is not None:
        log_extra["attempt"] = str(claim.job.attempts)
    if kind == transitions.ClaimKind.EXHAUSTED:
        log.error("job %s dead-lettered: attempt cap reached", payload.job_id, extra=log_extra)
        return Outcome(Verdict.DEAD_LETTER, "attempt cap reached")
    if kind != transitions.ClaimKind.CLAIMED:
        status = claim.job.status.value if claim.job is not None else "absent"
        log.info("job %s not run: %s (%s)", payload.job_id, kind, status, extra=log_extra)
        return Outcome(Verdict.ACK, f"{kind}: {status}")
    assert claim.job is not None
    log.info(
        "job %s claimed (attempt %d%s)",
        claim.job.id,
        claim.job.attempts,
        ", redelivered" if redelivered else "",
        extra=log_extra,
    )
    rt.start_job(claim.job.id)
    held_since = time.perf_counter()
    try:
        with job_context(**log_extra):
            return _run(rt, claim.job)
    finally:
        rt.end_job()
        WORKER_BUSY.labels(rt.name).inc(time.perf_counter() - held_since)


def _record(rt: WorkerRuntime, write: Callable[[Session], T]) -> T:
    """Write an outcome, riding out a database restart for up to DIFFQ_DB_RETRY seconds.

    The images are already in the store by then; regenerating them because PostgreSQL
    restarted would waste a GPU run. If the database stays away, the error propagates and
    the task hands the message back rather than ack an unrecorded outcome.
    """
    deadline = time.monotonic() + rt.settings.db_retry_seconds
    delay = 0.5
    while True:
        try:
            with rt.db.session() as session:
                return write(session)
        except OperationalError as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("database unavailable (%s); retrying in %.1fs", type(exc).__name__, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


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


def _run(rt: WorkerRuntime, job: Job) -> Outcome:
    model = rt.models.get(job.model)
    if model is None:
        return _fail(
            rt, job, ErrorCode.MODEL_UNAVAILABLE, f"this worker does not serve model {job.model!r}"
        )

    def write(progress: dict[str, Any]) -> bool:
        with rt.db.session() as session:
            return transitions.record_progress(
                session,
                job.id,
                owner=rt.owner,
                progress=progress,
                lease_seconds=rt.settings.lease_seconds,
            )

    def renew() -> bool:
        with rt.db.session() as session:
            return transitions.renew_lease(
                session, job.id, owner=rt.owner, lease_seconds=rt.settings.lease_seconds
            )

    reporter = ProgressReporter(
        write, interval=rt.settings.progress_interval, stop=rt.stop_requested
    )
    lease = LeaseKeeper(
        renew, interval=rt.settings.lease_seconds / 3, stop=rt.stop_requested
    ).start()
    try:
        return _generate_and_store(rt, job, model, reporter)
    finally:
        lease.close()
        reporter.close()


def _generate_and_store(
    rt: WorkerRuntime, job: Job, model: LoadedModel, reporter: ProgressReporter
) -> Outcome:
    params = job.input
    steps = int(params["steps"])
    started = time.perf_counter()
    try:
        if not reporter.stage("encoding_prompt", 0, steps):
            return Outcome(Verdict.ACK, "job no longer held before generation")
        images = generate_images(model.pipeline, params, device=model.device, on_step=reporter.step)
        generated = time.perf_counter()
        reporter.stage("uploading", steps, steps)
        uploaded = _encode_and_upload(rt, job, images, params)
    except Interrupted:
        return _stopped(rt, job, reporter.last_step)
    except SoftTimeLimitExceeded:
        limit = model.spec.soft_time_limit
        return _fail(rt, job, ErrorCode.TIMEOUT, f"the job exceeded its time limit of {limit}s")
    except StorageUnavailable as exc:
        return _fail(rt, job, ErrorCode.STORAGE_UNAVAILABLE, str(exc))
    except Exception as exc:
        if _is_out_of_memory(exc):
            _free_accelerator_memory()
            return _fail(
                rt, job, ErrorCode.GPU_OOM, "out of memory; retry with a smaller size or batch"
            )
        if isinstance(exc, ValueError):
            return _fail(rt, job, ErrorCode.INVALID_INPUT, f"the pipeline refused the input: {exc}")
        if _is_database_error(exc):
            raise  # the task hands the message back: the outcome could not be recorded
        log.exception("job %s crashed", job.id, extra={"job_id": str(job.id)})
        return _fail(rt, job, ErrorCode.INTERNAL, f"internal error ({type(exc).__name__})")
    manifest = job_manifest(
        model.manifest or {},
        job_scheduler(model.pipeline, params.get("scheduler", "default")),
        int(params["seed"]),
    )
    # The cache key from the weights this worker ran, not the ones the API assumed.
    key = cache_key(model.digest, params) if job.cache_key and model.digest else None
    recorded = _record(
        rt,
        lambda session: transitions.finish_succeeded(
            session,
            job.id,
            owner=rt.owner,
            result={"images": uploaded, "steps": steps},
            manifest=manifest,
            cache_key=key,
        ),
    )
    elapsed = time.perf_counter() - started
    if not recorded:
        log.warning("job %s finished but is no longer held; result not recorded", job.id)
        return Outcome(Verdict.ACK, "finished but no longer held", generated=True)
    JOBS_FINISHED.labels(job.model, "succeeded", "").inc()
    GENERATION_DURATION.labels(job.model, str(steps)).observe(generated - started)
    STEP_DURATION.labels(job.model).observe((generated - started) / max(1, steps))
    log.info(
        "job %s succeeded in %.3fs (generate %.3fs, encode+upload %.3fs, %d progress writes)",
        job.id,
        elapsed,
        generated - started,
        elapsed - (generated - started),
        reporter.writes,
        extra={"job_id": str(job.id)},
    )
    return Outcome(Verdict.ACK, "succeeded", generated=True)


def _stopped(rt: WorkerRuntime, job: Job, step: int) -> Outcome:
    """The run stopped at a step: handed back for a shutdown, or no longer ours."""
    extra = {"job_id": str(job.id)}
    if rt.hand_back_requested.is_set():
        handed = _record(rt, lambda s: transitions.hand_back(s, job.id, owner=rt.owner))
        if handed:
            log.warning(
                "job %s handed back at step %s: worker shutting down", job.id, step, extra=extra
            )
            return Outcome(Verdict.REQUEUE, "handed back: worker shutting down", generated=True)
    # Canceled, taken over by a redelivery, or reaped: the row already says which.
    log.info("job %s stopped at step %s: no longer held (canceled?)", job.id, step, extra=extra)
    return Outcome(Verdict.ACK, "stopped: job no longer held", generated=True)


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


def _is_out_of_memory(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError | MemoryError)


def _free_accelerator_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _is_database_error(exc: BaseException) -> bool:
    from sqlalchemy.exc import DBAPIError

    return isinstance(exc, DBAPIError)
