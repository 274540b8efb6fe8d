"""Job routes: submit, list, get, cancel, download."""

from __future__ import annotations

import hashlib
import json
import uuid

from flask import current_app, redirect, request
from flask.views import MethodView
from flask_smorest import abort

from app.jobs import service, transitions
from app.jobs.queue_info import fair_window, queue_info, running_eta
from app.jobs.states import ErrorCode, JobStatus
from app.jobs.view import job_json
from app.kinds import job_request
from app.web.auth import current_tenant, require_api_key
from app.web.bodies import Blueprint
from app.web.openapi import answers
from app.web.resources.jobs.presenter import decode_cursor, encode_cursor, job_view
from app.web.resources.jobs.schemas import (
    JobCreateSchema,
    JobListQuerySchema,
    JobPageSchema,
    JobSchema,
    PreferHeaderSchema,
    SubmitHeadersSchema,
)
from app.web.resources.jobs.submit import submit
from app.web.services import close_request_session, request_session, services
from app.web.wait import BadPreference, NoWaitSlot, requested_wait, wait_for_job

blp = Blueprint(
    "jobs", __name__, url_prefix="/v1/jobs", description="Submit generation jobs and follow them."
)
blp.before_request(require_api_key)

SUBMIT_EXAMPLE = {"prompt": "a lighthouse at dusk", "steps": 20, "seed": 42}
# One example per job kind (OpenAPI `examples`), each a body the API accepts.
SUBMIT_EXAMPLES = {
    "txt2img": {"summary": "Text to image", "value": SUBMIT_EXAMPLE},
    "img2img": {
        "summary": "Image to image: an upload redrawn, 60 % of the steps",
        "value": {
            "kind": "img2img",
            "prompt": "the same lighthouse in a winter storm",
            "image": "01a1f3c2-7b7e-7c4d-9a59-3f2f0d1c8e11",
            "strength": 0.6,
            "steps": 20,
            "seed": 42,
        },
    },
    "inpaint": {
        "summary": "Inpainting: white in the mask is redrawn, the rest kept",
        "value": {
            "kind": "inpaint",
            "prompt": "a red door",
            "image": "01a1f3c2-7b7e-7c4d-9a59-3f2f0d1c8e11",
            "mask": "01a1f3c2-8c21-7a10-b3e4-5d6e7f809a1b",
            "mask_blur": 4,
            "masked_only": True,
            "steps": 20,
        },
    },
    "txt2vid": {
        "summary": "Text to video: a clip of 25 frames at 24 fps (a video model)",
        "value": {
            "kind": "txt2vid",
            "model": "tiny-video",
            "prompt": "a paper boat drifting down a rain gutter",
            "num_frames": 25,
            "fps": 24,
            "steps": 4,
            "seed": 42,
        },
    },
    "img2vid": {
        "summary": "Image to video: an upload as the first frame",
        "value": {
            "kind": "img2vid",
            "model": "tiny-video",
            "prompt": "the lighthouse's beam sweeps through fog",
            "image": "01a1f3c2-7b7e-7c4d-9a59-3f2f0d1c8e11",
            "num_frames": 17,
            "steps": 4,
        },
    },
    "loras": {
        "summary": "Text to image with a LoRA adapter of the tenant's",
        "value": {
            "prompt": "a lighthouse, watercolor",
            "loras": [{"id": "01a1f3c2-9d32-7b21-84f5-6e7f8091a2b3", "scale": 0.8}],
        },
    },
}
LOCATION_HEADER = {"Location": {"description": "The new job's URL.", "schema": {"type": "string"}}}


def _not_found() -> None:
    abort(404, message="No such job.")


def _view(job, *, position: bool = True) -> dict:
    """With `position`, a queued job's queue position and ETA (the 202 leaves them out)."""
    svc = services()
    info = original = None  # each read only when needed (a submit's 202 needs neither)
    if position and job.status == JobStatus.QUEUED:
        info = queue_info(request_session(), job, fair_window(svc.settings))
    elif position and job.status == JobStatus.RUNNING:
        info = running_eta(job)
    if job.replay_of:
        original = service.get_job(request_session(), job.tenant_id, job.replay_of)
    return job_view(job, svc.storage, svc.settings.presign_ttl, info, original)


def _requested_wait(headers: dict) -> int | None:
    """`Prefer: wait=N`, capped by DIFFQ_MAX_WAIT; a `wait` that is no number is a 422."""
    try:
        return requested_wait(headers.get("prefer"), services().settings.max_wait)
    except BadPreference as exc:
        abort(422, errors={"headers": {"Prefer": [str(exc)]}})


def _body_hash() -> str:
    canonical = json.dumps(request.get_json(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _answer(job, wait: int | None, headers: dict[str, str]):
    """202 with the job as it is; with `Prefer: wait=N`, 200 once it finished within N s."""
    if wait is not None and not job.status.terminal:
        tenant_id, job_id = job.tenant_id, job.id
        close_request_session()  # no connection is held while waiting
        try:
            latest = wait_for_job(services(), tenant_id, job_id, wait)
        except NoWaitSlot:  # the tenant's (or the process's) held requests at their cap
            latest = None  # answered at once, as without the preference
        if latest is not None:  # finished, or as it is now that the wait ran out
            job = latest
    view = _view(job, position=wait is not None)
    # Rendered here rather than by the response schema: `job_json` is the same JSON, and
    # for a job just stored, a fraction of the schema's cost (docs/submit.md).
    body = current_app.json.response(job_json(view))
    headers = {"Location": view["urls"]["self"], **headers}
    if wait is not None and job.status.terminal:
        return body, 200, {**headers, "Preference-Applied": f"wait={wait}"}
    return body, 202, headers


@blp.route("")
class Jobs(MethodView):
    @blp.arguments(SubmitHeadersSchema(), location="headers")
    @blp.arguments(JobCreateSchema(), examples=SUBMIT_EXAMPLES)
    @blp.response(202, JobSchema, headers=LOCATION_HEADER)
    @blp.alt_response(
        200,
        schema=JobSchema,
        description="With `Prefer: wait=N`: the job finished (succeeded, failed or canceled) "
        "within N seconds; `Preference-Applied: wait=N`.",
    )
    @answers(
        blp,
        """
        400 The body is not JSON: not UTF-8, or a syntax error (the message gives
            its line and column).
        409 Idempotency-Key reused with a different body.
        413 Body larger than DIFFQ_MAX_BODY_BYTES.
        415 A body sent without `Content-Type: application/json` (names the header).
        429 Over the key's request rate, the tenant's cap on queued jobs or its
            daily GPU-second quota; see Retry-After.
        503 The job could not be made durable.
        """,
    )
    def post(self, headers, request_data):
        """Submit a job

        The job is stored, then queued; the answer comes before any GPU work. Poll the
        `Location` URL, or follow its `events` stream, for status, queue position and
        result (the `202` leaves `queue_position` and `eta_seconds` null). With an
        `Idempotency-Key` header, repeating the request returns the original job (with
        `Idempotent-Replayed: true`) instead of creating another. With `Prefer: wait=N`
        the answer waits up to N seconds (capped by DIFFQ_MAX_WAIT) for the job to finish
        (`200`, `Preference-Applied: wait=N`); if it has not, the `202` shows the job as it
        is when the wait ran out (running, with its progress, or still queued, with its
        position). N must be a whole number of seconds (`wait=abc` or `wait=-5` is a `422`
        naming `Prefer`); `wait=0` does not wait; other preferences are ignored. A client
        that disconnects while waiting leaves the job running.

        The body is a JSON object (`Content-Type: application/json`) of at most
        DIFFQ_MAX_BODY_BYTES, nested at most 32 levels deep, with numbers of at most 100
        characters and no `NaN` or `Infinity`.
        """
        wait = _requested_wait(headers)
        key = headers.get("idempotency_key")
        made = submit(request_data, idempotency_key=key, body_hash=_body_hash() if key else None)
        return _answer(made.job, wait, {"Idempotent-Replayed": "true"} if made.replayed else {})

    @blp.arguments(JobListQuerySchema, location="query")
    @blp.response(200, JobPageSchema)
    def get(self, args):
        """List your jobs, newest first

        Pass `next_cursor` back as `cursor` for the next page; it is null on the last.
        """
        before = None
        if "cursor" in args:
            before = decode_cursor(args["cursor"])
            if before is None:
                abort(422, errors={"query": {"cursor": ["Invalid cursor."]}})
        status = JobStatus(args["status"]) if "status" in args else None
        jobs, last = service.list_jobs(
            request_session(), current_tenant(), limit=args["limit"], status=status, before=before
        )
        return {
            "data": [_view(job) for job in jobs],
            "next_cursor": encode_cursor(last) if last else None,
        }


@blp.route("/<uuid:job_id>")
class JobById(MethodView):
    @blp.response(200, JobSchema)
    @blp.alt_response(404, description="No such job (or not yours).")
    def get(self, job_id: uuid.UUID):
        """Get a job

        Its status and progress; while queued, its `queue_position` and an estimated
        `eta_seconds`; once succeeded, the images' short-lived download URLs.
        """
        job = service.get_job(request_session(), current_tenant(), job_id)
        if job is None:
            _not_found()
        return _view(job)


@blp.route("/<uuid:job_id>/cancel")
class JobCancel(MethodView):
    @blp.response(200, JobSchema)
    @blp.alt_response(404, description="No such job (or not yours).")
    @blp.alt_response(409, description="The job has already finished.")
    def post(self, job_id: uuid.UUID):
        """Cancel a job

        A queued job is canceled at once and never reaches a GPU. A running job is
        canceled at once too; its worker stops at the next denoising step and takes the
        next job. A job that has finished answers 409.
        """
        session = request_session()
        job = service.get_job(session, current_tenant(), job_id)
        if job is None:
            _not_found()
        outcome = transitions.cancel_job(
            session, job, code=ErrorCode.CANCELED, message="canceled by the client"
        )
        if outcome == transitions.CancelOutcome.ALREADY_FINISHED:
            abort(409, message=f"The job has already {job.status.value}.")
        session.commit()
        if outcome == transitions.CancelOutcome.CANCELED_QUEUED:
            services().broker.discard([job.id])  # committed: its waiting message can go
        session.refresh(job)
        return _view(job)


@blp.route("/<uuid:job_id>/replay")
class JobReplay(MethodView):
    @blp.arguments(PreferHeaderSchema, location="headers")
    @blp.response(202, JobSchema, headers=LOCATION_HEADER)
    @blp.alt_response(
        200, schema=JobSchema, description="With `Prefer: wait=N`: the replay finished in time."
    )
    @answers(
        blp,
        """
        404 No such job (or not yours).
        409 The job's model is no longer configured.
        429 Over the rate or the cap on queued jobs.
        """,
    )
    def post(self, headers, job_id: uuid.UUID):
        """Replay a job

        Runs the job's normalized inputs (seed included) again as a new job, never from the
        result cache. Once both have finished, the new job's `replay.bytes_match` says
        whether its images are byte for byte the original's; compare the two `manifest`s
        to see what differed (weights, scheduler, dtype, device, versions).
        """
        svc = services()
        wait = _requested_wait(headers)
        original = service.get_job(request_session(), current_tenant(), job_id)
        if original is None:
            _not_found()
        spec = svc.catalog.get(original.model)
        if spec is None:
            abort(409, message=f"Model {original.model!r} is no longer configured.")
        made = submit(
            {"spec": spec, "request": job_request(original), "seeded": True, "cache": False},
            replay_of=original.id,
        )
        return _answer(made.job, wait, {})


@blp.route("/<uuid:job_id>/images/<int:index>")
class JobImage(MethodView):
    @blp.response(302, description="Redirect to a short-lived download URL.")
    @blp.alt_response(404, description="No such job or image, or the job has not succeeded.")
    @blp.alt_response(410, description="The images were removed after the retention period.")
    def get(self, job_id: uuid.UUID, index: int):
        """Download an image

        Redirects to a presigned URL valid for DIFFQ_PRESIGN_TTL seconds.
        """
        svc = services()
        job = service.get_job(request_session(), current_tenant(), job_id)
        if job is None:
            _not_found()
        if job.data_removed_at is not None:
            abort(410, message="The images were removed after the retention period.")
        images = (job.result or {}).get("images", [])
        if job.status != JobStatus.SUCCEEDED or not 0 <= index < len(images):
            abort(404, message="No such image.")
        return redirect(svc.storage.url(images[index]["key"], svc.settings.presign_ttl), 302)
