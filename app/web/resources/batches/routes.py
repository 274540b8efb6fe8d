"""POST /v1/batches (diffq's form or OpenAI's), list, get, cancel, results."""

from __future__ import annotations

import json
import uuid

from flask import Response, current_app, request, stream_with_context
from flask.views import MethodView
from flask_smorest import abort
from sqlalchemy import select

from app.batches import lifecycle
from app.batches.ingest import create_batch, create_failed
from app.batches.render import batch_object, result_lines
from app.db.models.batches import Batch, BatchFile
from app.jobs.states import JobStatus
from app.jobs.submit import Caps, Refused
from app.web.auth import current_tenant, require_api_key, tenant_quota
from app.web.bodies import Blueprint
from app.web.errors import found
from app.web.openapi import answers
from app.web.resources.batches import errors
from app.web.resources.batches.parse import parse
from app.web.resources.batches.schemas import (
    BATCH_BODY,
    BatchListQuerySchema,
    BatchListSchema,
    BatchSchema,
)
from app.web.services import request_session, services

blp = Blueprint(
    "batches",
    __name__,
    url_prefix="/v1/batches",
    description="Many jobs as one: one status, one cancel, one completion webhook, result "
    "files. Also OpenAI's Batch API (its `input_file_id` form).",
)
blp.before_request(require_api_key)
errors.install(blp)


@blp.before_request
def _larger_bodies() -> None:
    request.max_content_length = services().settings.batch_max_bytes


def _batch_or_404(batch_id: uuid.UUID) -> Batch:
    mine = select(Batch).where(Batch.id == batch_id, Batch.tenant_id == current_tenant())
    return found(request_session().scalar(mine), "batch")


def _object(batch: Batch) -> dict:
    session = request_session()
    # Every line ended: its end is recorded now (else by the relay's next pass).
    if (
        batch.finished_at is None
        and batch.status != "validating"
        and lifecycle.finish(session, batch)
    ):
        session.commit()
        session.refresh(batch)
    jobs = lifecycle.job_counts(session, [batch.id])[batch.id] if batch.counts is None else None
    counts = lifecycle.counts_of(batch, jobs) if jobs is not None else dict(batch.counts)
    return batch_object(batch, counts, request.url_root)


def _read_file(file_id: uuid.UUID) -> bytes | None:
    found = request_session().scalar(
        select(BatchFile).where(
            BatchFile.id == file_id,
            BatchFile.tenant_id == current_tenant(),
            BatchFile.purpose == "batch",
        )
    )
    if found is None or found.storage_key is None:
        return None
    return services().storage.get(found.storage_key)


def _json(body: dict, status: int, headers: dict | None = None):
    return current_app.json.response(body), status, headers or {}


@blp.route("")
class Batches(MethodView):
    @blp.doc(requestBody=BATCH_BODY)
    @blp.response(202, BatchSchema)
    @blp.alt_response(200, schema=BatchSchema, description="An Idempotency-Key replayed.")
    @answers(
        blp,
        """
        400 The body is not valid JSON.
        404 `input_file_id` names no file of yours.
        409 Idempotency-Key reused with a different body.
        413 Over DIFFQ_BATCH_MAX_BYTES or DIFFQ_BATCH_MAX_LINES (named).
        422 diffq's form: a bad request refuses the whole batch; `errors.lines`
            names each bad line (1-based) and its fields. Also: no requests, a bad
            option.
        415 Neither application/json nor application/jsonl.
        429 The tenant's daily GPU quota, or its cap on queued jobs: every job of
            the batch counts, and one that does not fit is refused whole
            (Retry-After).
        """,
    )
    def post(self):
        """Submit a batch

        Many job requests at once, each with your `custom_id`: stored and queued in bulk
        before the answer (`202`, `status: in_progress`). Two forms, told apart by
        `input_file_id`:

        - **diffq's**: `application/json` with `requests` (a list of POST /v1/jobs
          bodies, each with `custom_id`), or `application/jsonl` (one such body a line,
          the options `completion_window`, `webhook`, `metadata` in the query string).
          Any bad request refuses the whole batch (`422`, `errors.lines`).
        - **OpenAI's**: `input_file_id` (a file uploaded with `POST /v1/files`, purpose
          `batch`), `endpoint` (`/v1/images/generations` or `/v1/jobs`) and
          `completion_window`. Unreadable lines make the batch `failed` with `errors`;
          a request whose body breaks a rule goes to the error file alone.

        Each job counts under your quota and caps like a single submit, and fair share
        treats it as any other job. `completion_window` (like `24h`, `90m`, or seconds):
        jobs not started by then end `expired`. With an `Idempotency-Key`, the same
        request answers with the same batch (and finishes storing one whose ingest was
        cut off).
        """
        svc = services()
        parsed = parse(svc.settings, _read_file)
        session = request_session()
        tenant = current_tenant()
        caps = Caps(svc.settings.max_queued, svc.settings.max_running, tenant_quota())
        try:
            if parsed.failed:
                total = len(parsed.request.lines) + len(parsed.failed)
                made = create_failed(session, tenant, parsed.request, parsed.failed, total)
            else:
                made = create_batch(session, svc.publisher, tenant, parsed.request, caps)
        except Refused as refused:
            headers = {"Retry-After": str(refused.retry_after)} if refused.retry_after else {}
            abort(refused.status, message=refused.message, headers=headers)
        body = _object(made.batch)
        headers = {"Location": body["urls"]["self"]}
        if made.replayed:
            return _json(body, 200, {**headers, "Idempotent-Replayed": "true"})
        return _json(body, 202, headers)

    @blp.arguments(BatchListQuerySchema, location="query")
    @blp.response(200, BatchListSchema)
    @blp.alt_response(
        422,
        description="A query parameter that is not one, or out of its range: both envelopes "
        "(`errors.query` names it; `error.param` too).",
    )
    def get(self, args):
        """List your batches, newest first

        Pass `last_id` back as `after` for the next page while `has_more`.
        """
        query = select(Batch).where(Batch.tenant_id == current_tenant())
        if args.get("after"):
            query = query.where(Batch.id < args["after"])
        limit = args["limit"]
        rows = list(request_session().scalars(query.order_by(Batch.id.desc()).limit(limit + 1)))
        more, rows = len(rows) > limit, rows[:limit]
        open_ids = [b.id for b in rows if b.counts is None]
        counts = lifecycle.job_counts(request_session(), open_ids)
        data = [
            batch_object(
                b,
                lifecycle.counts_of(b, counts[b.id]) if b.counts is None else dict(b.counts),
                request.url_root,
            )
            for b in rows
        ]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": more,
        }


@blp.route("/<uuid:batch_id>")
class BatchById(MethodView):
    @blp.response(200, BatchSchema)
    @blp.alt_response(404, description="No such batch (or not yours).")
    def get(self, batch_id: uuid.UUID):
        """Get a batch

        Its status (`validating`, `in_progress`, `finalizing`, then `completed`,
        `expired`, `cancelled` or `failed`), `counts` (every request in exactly one of
        queued, running, succeeded, failed, canceled, expired, invalid) and, once ended,
        its `output_file_id` and `error_file_id` and the results file.
        """
        return _json(_object(_batch_or_404(batch_id)), 200)


@blp.route("/<uuid:batch_id>/cancel")
class BatchCancel(MethodView):
    @blp.response(200, BatchSchema)
    @blp.alt_response(404, description="No such batch (or not yours).")
    @blp.alt_response(409, description="The batch has already ended.")
    def post(self, batch_id: uuid.UUID):
        """Cancel a batch

        Its queued jobs are canceled at once and never reach a GPU; running ones at their
        next denoising step; finished ones are kept, and are in its files. The batch is
        `cancelling` until every job has stopped, then `cancelled`.
        """
        session = request_session()
        batch = _batch_or_404(batch_id)
        if batch.finished_at is not None:
            abort(409, message=f"The batch has already ended ({batch.status}).")
        ended = lifecycle.cancel(session, batch)
        session.commit()
        # Committed: the queued jobs' waiting messages can go (on the embedded broker).
        services().broker.discard(i for i, was in ended if was == JobStatus.QUEUED)
        session.refresh(batch)
        return _json(_object(batch), 200)


@blp.route("/<uuid:batch_id>/results")
class BatchResults(MethodView):
    @blp.response(
        200,
        description="JSON Lines, one per request in input order: `custom_id`, `line`, "
        "`job_id`, `status` (succeeded, failed, canceled, expired, invalid), `images` (with "
        "fresh download links) or `error`.",
        content_type="application/jsonl",
    )
    @blp.alt_response(404, description="No such batch (or not yours).")
    @blp.alt_response(409, description="The batch has not ended yet.")
    def get(self, batch_id: uuid.UUID):
        """Download a batch's results

        Every request once, in input order, once the batch has ended.
        """
        batch = _batch_or_404(batch_id)
        _object(batch)  # records its end if every line has ended
        if batch.finished_at is None:
            abort(409, message=f"The batch has not ended yet ({batch.status}).")
        svc = services()
        return Response(
            stream_with_context(_lines(svc, batch.id)),
            mimetype="application/jsonl",
            headers={"Content-Disposition": f'attachment; filename="batch_{batch.id}.jsonl"'},
        )


def _lines(svc, batch_id: uuid.UUID):
    base_url = request.url_root
    with svc.db.session() as session:
        batch = session.get(Batch, batch_id)
        for line in result_lines(session, batch, svc.storage, svc.settings.presign_ttl, base_url):
            yield json.dumps(line, separators=(",", ":")) + "\n"
