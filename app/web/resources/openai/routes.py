"""POST /v1/images/generations: the OpenAI Images API over diffq jobs.

The request becomes an ordinary job (same auth, rate limits, caps, queue and workers;
listed in /v1/jobs) and the answer waits for it, up to DIFFQ_MAX_WAIT seconds. Errors
use OpenAI's envelope (`error.message`, `type`, `param`, `code`) so OpenAI clients raise
their own error types; 5xx answers carry `x-should-retry: false`, since a retry would
make another job.
"""

from __future__ import annotations

import base64
from typing import Any

import marshmallow as ma
from flask import jsonify, request
from flask.views import MethodView
from flask_smorest import Blueprint
from werkzeug.exceptions import HTTPException

from app.jobs.states import JobStatus
from app.jobs.view import image_url
from app.web.auth import current_tenant, require_api_key
from app.web.resources.jobs.schemas import JobCreateSchema
from app.web.resources.jobs.submit import submit
from app.web.resources.openai.schemas import ImagesGenerateSchema, ImagesResponseSchema
from app.web.services import close_request_session, services
from app.web.wait import wait_for_finish

blp = Blueprint(
    "openai_images",
    __name__,
    url_prefix="/v1/images",
    description="OpenAI-compatible image generation: point an OpenAI client's `base_url` at "
    "`<diffq>/v1`.",
)
blp.before_request(require_api_key)

OPENAI_MODEL_NAMES = ("dall-e-2", "dall-e-3", "gpt-image-1", "gpt-image-1-mini")
# diffq's field names in validation errors, as this endpoint's clients name them.
FIELD_NAMES = {"num_images": "n", "width": "size", "height": "size", "metadata": "user"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
EXAMPLE = {"prompt": "a lighthouse at dusk", "n": 1, "size": "512x512"}


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, *, param=None, code=None, headers=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}


def _error_response(status: int, message: str, param=None, code=None, headers=None):
    body = {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "server_error" if status >= 500 else "api_error"),
            "param": param,
            "code": code,
        }
    }
    response = jsonify(body)
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    if status >= 500:
        response.headers["x-should-retry"] = "false"
    return response


@blp.errorhandler(OpenAIError)
def _openai_error(exc: OpenAIError):
    return _error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)


@blp.errorhandler(HTTPException)
def _http_error(exc: HTTPException):
    data = getattr(exc, "data", None) or {}
    message = data.get("message") or exc.description or exc.name
    param = None
    errors = data.get("errors") or data.get("messages") or {}
    for location in ("json", "headers", "query"):
        if errors.get(location):
            param, messages = next(iter(errors[location].items()))
            message = f"{param}: {' '.join(str(m) for m in messages)}"
            break
    code = "invalid_value" if exc.code == 422 else None
    return _error_response(exc.code or 500, message, param, code, data.get("headers"))


def _job_request(body: dict[str, Any]) -> dict[str, Any]:
    """The equivalent POST /v1/jobs body, validated by the same schema and limits."""
    model = body["model"]
    job: dict[str, Any] = {
        "prompt": body["prompt"],
        "num_images": body["n"],
        "output_format": "png",
    }
    if model is not None and model not in OPENAI_MODEL_NAMES:
        job["model"] = model
    if body["size"]:
        width, _, height = body["size"].partition("x")
        job["width"], job["height"] = int(width), int(height)
    if body["user"]:
        job["metadata"] = {"user": body["user"]}
    for name in ("seed", "steps", "negative_prompt", "guidance_scale"):
        if name in body:
            job[name] = body[name]
    try:
        return JobCreateSchema().load(job)
    except ma.ValidationError as exc:
        messages = exc.messages if isinstance(exc.messages, dict) else {"prompt": exc.messages}
        field, problems = next(iter(messages.items()))
        param = FIELD_NAMES.get(field, field)
        text = " ".join(str(p) for p in problems) if isinstance(problems, list) else str(problems)
        raise OpenAIError(422, f"{param}: {text}", param=param, code="invalid_value") from exc


def _image_data(job, response_format: str) -> list[dict[str, Any]]:
    svc = services()
    data = []
    for image in (job.result or {}).get("images", []):
        if response_format == "b64_json":
            encoded = base64.b64encode(svc.storage.get(image["key"])).decode()
            data.append({"b64_json": encoded, "revised_prompt": None})
        else:
            url = image_url(svc.storage, image["key"], svc.settings.presign_ttl, request.url_root)
            data.append({"url": url, "revised_prompt": None})
    return data


@blp.route("/generations")
class Generations(MethodView):
    @blp.arguments(ImagesGenerateSchema(), example=EXAMPLE)
    @blp.response(
        200,
        ImagesResponseSchema,
        headers={
            "diffq-job-id": {
                "description": "The job behind the answer.",
                "schema": {"type": "string"},
            }
        },
    )
    @blp.alt_response(401, description="No or bad API key (`authentication_error`).")
    @blp.alt_response(422, description="A parameter breaks a limit; `error.param` names it.")
    @blp.alt_response(429, description="Over the key's rate or the tenant's cap; Retry-After.")
    @blp.alt_response(
        500, description="The job failed or was canceled; `error.code` is the job's error code."
    )
    @blp.alt_response(
        504,
        description="Not finished within DIFFQ_MAX_WAIT seconds. The job keeps running: "
        "`error.message` and the `diffq-job-id` header name it.",
    )
    def post(self, body):
        """Create images (OpenAI-compatible)

        Synchronous: answers with the images once the job finishes, like OpenAI's
        `images.generate`. The job is an ordinary diffq job (see `GET /v1/jobs`).
        """
        svc = services()
        made = submit(_job_request(body))
        job = made.job
        tenant_id, job_id = current_tenant(), job.id
        if not job.status.terminal:
            close_request_session()
            job = wait_for_finish(svc, tenant_id, job_id, svc.settings.max_wait)
        headers = {"diffq-job-id": str(job_id)}
        if job is None:
            raise OpenAIError(
                504,
                f"Job {job_id} did not finish within {svc.settings.max_wait}s; it keeps "
                f"running: GET /v1/jobs/{job_id}",
                code="timeout",
                headers=headers,
            )
        if job.status != JobStatus.SUCCEEDED:
            raise OpenAIError(
                500,
                f"Job {job_id} {job.status.value}: {job.error_message or 'no images'}",
                code=job.error_code or job.status.value,
                headers=headers,
            )
        created = int(job.created_at.timestamp())
        return {"created": created, "data": _image_data(job, body["response_format"])}, 200, headers
