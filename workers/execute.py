"""One delivery of a job message, from claim to verdict: the message is parsed, the job it
starts is claimed (workers/claim.py), and the job runs alone or, on a batching model,
with the compatible jobs it gathers (workers/batch.py). What the broker does with the
message is the caller's (tasks/generate.py): this module returns an `Outcome`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app.broker.payload import InvalidPayload, parse_payload
from app.db.models.jobs import Job
from app.jobs import pauses, transitions
from app.jobs.states import ErrorCode
from app.kinds import job_request
from app.logs import job_context
from workers import record, run
from workers.batch import execute_batch
from workers.claim import claim_for_message, give_up
from workers.gather import PermitSource
from workers.outcome import Outcome, Verdict
from workers.pausing import hold_seconds
from workers.pipelines import ModelLoadError

if TYPE_CHECKING:
    from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)

__all__ = ["Outcome", "Verdict", "execute_job"]


def execute_job(
    rt: WorkerRuntime,
    raw_payload: Any,
    *,
    redelivered: bool,
    open_permits: Callable[[str], PermitSource | None] | None = None,
) -> Outcome:
    """Run the job this message starts. `open_permits(queue)`, where given, lets a
    batching model's job take further compatible messages of its queue into one pipeline
    call (docs/batching.md)."""
    rt.begin_delivery()
    try:
        payload = parse_payload(raw_payload)
    except InvalidPayload as exc:
        if exc.job_id is not None:
            with rt.db.session() as session:
                if transitions.finish_failed(
                    session, exc.job_id, code=ErrorCode.INVALID_MESSAGE, message=str(exc)
                ):
                    record.count_failed(session.get(Job, exc.job_id), ErrorCode.INVALID_MESSAGE)
        log.error("dead-lettering a broken message: %s", exc)
        return Outcome(Verdict.DEAD_LETTER, f"invalid message: {exc}")

    with rt.db.session() as session:
        paused = pauses.job_paused(session, payload.job_id)
    if paused:
        # Its workers stop consuming the queue within DIFFQ_PAUSE_POLL (workers/
        # pausing.py): held that long, the message goes back to wait, claiming nothing.
        time.sleep(hold_seconds(rt.settings))
        log.info("job %s not run: its model is paused", payload.job_id)
        return Outcome(Verdict.REQUEUE, "model paused: back to the queue")
    with rt.db.session() as session:
        claim = claim_for_message(
            rt, session, payload.job_id, redelivered=redelivered, requeues=payload.requeues
        )
        if claim.kind == transitions.ClaimKind.EXHAUSTED:
            assert claim.job is not None
            give_up(session, claim.job)
    job = claim.job
    context = {"job_id": str(job.id if job else payload.job_id), "tenant": str(payload.tenant)}
    if job is not None:
        context["attempt"] = str(job.attempts)
    if claim.kind == transitions.ClaimKind.EXHAUSTED:
        log.error("job %s dead-lettered: attempt cap reached", context["job_id"], extra=context)
        return Outcome(Verdict.DEAD_LETTER, "attempt cap reached")
    if claim.kind == transitions.ClaimKind.ELSEWHERE:
        log.info("job %s: to the idle worker that holds its model", context["job_id"])
        return Outcome(Verdict.REQUEUE, "handed to the idle worker that holds its model")
    if claim.kind != transitions.ClaimKind.CLAIMED:
        status = job.status.value if job is not None else "absent"
        log.info("job %s not run: %s (%s)", context["job_id"], claim.kind, status, extra=context)
        return Outcome(Verdict.DISCARD, f"{claim.kind}: {status}")
    assert job is not None
    log.info(
        "job %s claimed (attempt %d%s%s)",
        job.id,
        job.attempts,
        ", redelivered" if redelivered else "",
        f", on the message of job {payload.job_id} (fair share)"
        if job.id != payload.job_id
        else "",
        extra=context,
    )
    with job_context(**context):
        try:
            model = rt.models.get(job.model)  # loaded now where it was not (workers/models.py)
        except ModelLoadError as exc:
            return record.fail(rt, job, ErrorCode.MODEL_UNAVAILABLE, str(exc))
        if model is None:
            served = f"this worker does not serve model {job.model!r}"
            return record.fail(rt, job, ErrorCode.MODEL_UNAVAILABLE, served)
        spec = model.spec
        if spec.spans_deliveries and job.spent_seconds >= spec.soft_time_limit:
            return record.timed_out(rt, job, spec)  # its budget spent by earlier deliveries
        request = job_request(job)
        if open_permits is not None and model.spec.batches(request.width, request.height):
            return execute_batch(rt, job, model, open_permits)
        alone = run.Member(job)
        run.run(rt, model, [alone])
        assert alone.outcome is not None
        return alone.outcome
