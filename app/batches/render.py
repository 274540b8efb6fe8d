"""What clients read of a batch: the batch object, and its three files, rendered from
its jobs when read (so image links are freshly signed at every download).

- The batch object is OpenAI's Batch (its field names, statuses and Unix-second times,
  so the `openai` client reads it as its own), plus diffq's `counts` (every line in
  exactly one state), `webhook` and `urls`, for every batch, whichever way it was made.
- The results file (`GET /v1/batches/{id}/results`): one line per request, in input
  order: `custom_id`, `line`, `job_id`, `status`, `images` or `error`.
- The output and error files (`GET /v1/files/{id}/content`): OpenAI's batch output
  lines, `{"id", "custom_id", "response": {"status_code", "request_id", "body"},
  "error"}`; succeeded requests in the output file, everything else in the error file,
  so every line is in exactly one of the two. A request's `body` is what its endpoint
  answers: the job object for `/v1/jobs`, OpenAI's images response for
  `/v1/images/generations`.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.batches.ingest import line_of
from app.batches.lifecycle import shown_status, summary
from app.db.models.batches import Batch
from app.db.models.jobs import Job
from app.jobs.states import ErrorCode, JobStatus
from app.jobs.view import image_url, job_json, job_view
from app.storage import Storage

BATCH_PATHS = {
    "self": "/v1/batches/{id}",
    "cancel": "/v1/batches/{id}/cancel",
    "results": "/v1/batches/{id}/results",
}


def _ts(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def batch_object(batch: Batch, counts: dict[str, int], base_url: str) -> dict[str, Any]:
    status = shown_status(batch, counts)
    ended = batch.finished_at if status in ("completed", "expired", "cancelled", "failed") else None
    base = base_url.rstrip("/")
    return {
        "id": str(batch.id),
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": batch.errors,
        "input_file_id": str(batch.input_file_id) if batch.input_file_id else None,
        "completion_window": batch.completion_window,
        "status": status,
        "output_file_id": str(batch.output_file_id) if batch.output_file_id else None,
        "error_file_id": str(batch.error_file_id) if batch.error_file_id else None,
        "created_at": _ts(batch.created_at),
        "in_progress_at": _ts(batch.in_progress_at),
        "expires_at": _ts(batch.expires_at),
        "finalizing_at": _ts(batch.finalizing_at),
        "completed_at": _ts(ended) if status == "completed" else None,
        "failed_at": _ts(ended) if status == "failed" else None,
        "expired_at": _ts(batch.expired_at),
        "cancelling_at": _ts(batch.cancelling_at),
        "cancelled_at": _ts(ended) if status == "cancelled" else None,
        "request_counts": summary(batch, counts),
        "metadata": batch.client_metadata,
        "counts": counts,
        "webhook": batch.webhook_url,
        "urls": {name: base + path.format(id=batch.id) for name, path in BATCH_PATHS.items()},
    }


def _jobs(session: Session, batch: Batch) -> Iterator[Job]:
    query = (
        select(Job)
        .where(Job.batch_id == batch.id)
        .order_by(Job.id)
        .execution_options(yield_per=500)
    )
    yield from session.scalars(query)


def _in_line_order(session: Session, batch: Batch) -> Iterator[tuple[int, Job | None, dict]]:
    """(line, job, refusal): every line of the batch once, in input order."""
    refused = sorted(batch.invalid_lines or [], key=lambda item: item["line"])
    at = 0
    for job in _jobs(session, batch):
        line = line_of(job.id)
        while at < len(refused) and refused[at]["line"] < line:
            yield refused[at]["line"], None, refused[at]
            at += 1
        yield line, job, {}
    for item in refused[at:]:
        yield item["line"], None, item


def _error_of(job: Job) -> dict[str, Any] | None:
    if job.status == JobStatus.SUCCEEDED:
        return None
    if job.status.terminal:
        return {"code": job.error_code, "message": job.error_message}
    return {"code": "not_finished", "message": f"the job is {job.status.value}"}


def result_lines(
    session: Session, batch: Batch, storage: Storage, presign_ttl: int, base_url: str
) -> Iterator[dict[str, Any]]:
    """The results file: every request once, in input order."""
    for line, job, refusal in _in_line_order(session, batch):
        if job is None:
            error = {k: refusal.get(k) for k in ("code", "message", "param")}
            yield {
                "custom_id": refusal["custom_id"],
                "line": line,
                "job_id": None,
                "status": "invalid",
                "images": None,
                "error": error,
            }
            continue
        images = None
        if job.status == JobStatus.SUCCEEDED and job.result is not None:
            view = job_json(job_view(job, storage, presign_ttl, base_url))
            images = view["result"]["images"] if view["result"] else None
        status = job.status.value
        if job.status == JobStatus.CANCELED and job.error_code == ErrorCode.EXPIRED.value:
            status = "expired"
        yield {
            "custom_id": job.custom_id,
            "line": line,
            "job_id": str(job.id),
            "status": status,
            "images": images,
            "error": _error_of(job),
        }


def _images_body(
    job: Job, storage: Storage, presign_ttl: int, base_url: str, inline: bool
) -> dict[str, Any]:
    data = []
    for image in (job.result or {}).get("images", []):
        if inline:
            encoded = base64.b64encode(storage.get(image["key"])).decode()
            data.append({"b64_json": encoded, "revised_prompt": None})
        else:
            url = image_url(storage, image["key"], presign_ttl, base_url)
            data.append({"url": url, "revised_prompt": None})
    return {"created": _ts(job.created_at), "data": data}


def _failure(job: Job) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(response, error) of an output line for a job that did not succeed."""
    if job.status == JobStatus.CANCELED:
        code = "batch_expired" if job.error_code == ErrorCode.EXPIRED.value else "batch_cancelled"
        return None, {"code": code, "message": job.error_message or job.error_code}
    error = {
        "message": f"Job {job.id} {job.status.value}: {job.error_message or job.error_code}",
        "type": "server_error",
        "param": None,
        "code": job.error_code,
    }
    return {"status_code": 500, "request_id": str(job.id), "body": {"error": error}}, None


def output_lines(
    session: Session,
    batch: Batch,
    storage: Storage,
    presign_ttl: int,
    base_url: str,
    *,
    errors: bool,
) -> Iterator[dict[str, Any]]:
    """The output file (`errors` False: succeeded requests) or the error file (the rest),
    in input order, each line in OpenAI's batch output shape."""
    inline = set(batch.b64_json or ())
    body: Callable[[Job], dict[str, Any]]
    if batch.endpoint == "/v1/jobs":

        def body(job: Job) -> dict[str, Any]:
            return job_json(job_view(job, storage, presign_ttl, base_url))

    else:

        def body(job: Job) -> dict[str, Any]:
            return _images_body(job, storage, presign_ttl, base_url, job.custom_id in inline)

    for line, job, refusal in _in_line_order(session, batch):
        if job is None:
            if errors:
                yield {
                    "id": f"batch_req_{batch.id.hex}_{line}",
                    "custom_id": refusal["custom_id"],
                    "response": {
                        "status_code": refusal.get("status", 422),
                        "request_id": None,
                        "body": {
                            "error": {
                                "message": refusal.get("message"),
                                "type": "invalid_request_error",
                                "param": refusal.get("param"),
                                "code": refusal.get("code"),
                            }
                        },
                    },
                    "error": None,
                }
            continue
        succeeded = job.status == JobStatus.SUCCEEDED
        if succeeded == errors:
            continue
        if succeeded:
            response = {"status_code": 200, "request_id": str(job.id), "body": body(job)}
            error = None
        else:
            response, error = _failure(job)
        yield {
            "id": f"batch_req_{job.id.hex}",
            "custom_id": job.custom_id,
            "response": response,
            "error": error,
        }
