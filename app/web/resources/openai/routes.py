"""POST /v1/images/generations and /v1/images/edits: the OpenAI Images API over diffq jobs.

The request becomes an ordinary job (same auth, rate limits, caps, queue and workers;
listed in /v1/jobs) and the answer waits for it, up to DIFFQ_MAX_WAIT seconds. Errors
use OpenAI's envelope (`error.message`, `type`, `param`, `code`) so OpenAI clients raise
their own error types; 5xx answers carry `x-should-retry: false`, since a retry would
make another job.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import marshmallow as ma
from flask import request
from flask.views import MethodView
from werkzeug.exceptions import HTTPException

from app import uploads
from app.jobs.states import JobStatus
from app.jobs.view import image_url
from app.quality import openai_tier
from app.uploads import InputRefused
from app.web.auth import current_tenant, require_api_key
from app.web.bodies import Blueprint
from app.web.errors import as_http_error
from app.web.inputs import checked_png
from app.web.openai_errors import error_answer, error_object
from app.web.openapi import BINARY, answers, form_body
from app.web.resources.jobs.schemas import JobCreateSchema
from app.web.resources.jobs.submit import submit
from app.web.resources.openai.schemas import (
    MAX_N,
    ImagesEditSchema,
    ImagesGenerateSchema,
    ImagesResponseSchema,
)
from app.web.services import close_request_session, services
from app.web.wait import NoWaitSlot, WaitSlot, wait_for_finish

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
# The header every synchronous answer carries: the diffq job it came from.
JOB_ID_HEADER = {
    "diffq-job-id": {"description": "The job behind the answer.", "schema": {"type": "string"}}
}
EXAMPLE = {"prompt": "a lighthouse at dusk", "n": 1, "size": "512x512"}
# POST /v1/images/edits: a multipart form, as OpenAI's clients send it.
EDIT_BODY = form_body(
    {
        "image": {
            **BINARY,
            "description": "The image to edit: PNG, JPEG or WebP (`image[]`: the first is read).",
        },
        "mask": {
            **BINARY,
            "description": "A PNG of the image's size, fully transparent where to edit.",
        },
        "prompt": {"type": "string"},
        "model": {"type": "string"},
        "n": {"type": "integer", "minimum": 1, "maximum": MAX_N},
        "size": {"type": "string", "example": "512x512"},
        "response_format": {"type": "string", "enum": ["url", "b64_json"]},
        "user": {"type": "string"},
        "strength": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "description": "diffq extension: how much is redrawn.",
        },
        "seed": {"type": "integer", "description": "diffq extension."},
        "steps": {"type": "integer", "description": "diffq extension."},
    },
    ["prompt", "image"],
)


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, *, param=None, code=None, headers=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}


def _error_response(status: int, message: str, param=None, code=None, headers=None):
    return error_answer({"error": error_object(status, message, param, code)}, status, headers)


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
        found = errors.get(location)
        if isinstance(found, dict) and found:
            param, messages = next(iter(found.items()))
            text = " ".join(str(m) for m in messages)
            param = None if param == "_schema" else param  # the body as a whole
            message = f"{param}: {text}" if param else text
            break
        if isinstance(found, list) and found:  # about the body as a whole (not JSON)
            message = " ".join(str(m) for m in found)
            break
    code = "invalid_value" if exc.code == 422 else None
    return _error_response(exc.code or 500, message, param, code, data.get("headers"))


@blp.errorhandler(Exception)
def _any_error(exc: Exception):
    # Anything else (a database refusal, an outage, a bug) in OpenAI's envelope too.
    return _http_error(as_http_error(exc))


def _job_request(body: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The equivalent POST /v1/jobs body, validated by the same schema and limits;
    `fields`: more of the job's own (an edit's kind and images)."""
    model = body["model"]
    job: dict[str, Any] = {
        "prompt": body["prompt"],
        "num_images": body["n"],
        "output_format": "png",
        **fields,
    }
    if model is not None and model not in OPENAI_MODEL_NAMES:
        job["model"] = model
    if body["size"]:
        width, _, height = body["size"].partition("x")
        job["width"], job["height"] = int(width), int(height)
    if body["user"]:
        job["metadata"] = {"user": body["user"]}
    for name in ("seed", "steps", "negative_prompt", "guidance_scale", "strength"):
        if name in body:
            job[name] = body[name]
    spec = services().catalog.get(job.get("model"))
    if body.get("quality") and spec is not None:
        job["quality"] = openai_tier(body["quality"], spec.quality, spec.default_quality)
    return loaded_job(job, FIELD_NAMES)


def loaded_job(job: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """`job` loaded as a diffq job request (the `POST /v1/jobs` schema); its first
    refusal as OpenAI's 422, naming the OpenAI parameter behind the field (`names`)."""
    try:
        return JobCreateSchema().load(job)
    except ma.ValidationError as exc:
        messages = exc.messages if isinstance(exc.messages, dict) else {"prompt": exc.messages}
        field, problems = next(iter(messages.items()))
        param = names.get(field, field)
        text = " ".join(str(p) for p in problems) if isinstance(problems, list) else str(problems)
        raise OpenAIError(422, f"{param}: {text}", param=param, code="invalid_value") from exc


def _answered(request_data: dict[str, Any], response_format: str):
    """Submit the job, wait for it, and answer with its images as OpenAI does. The wait's
    slot is taken first: a tenant (or a process) at its cap of held requests is answered
    429 before any job is made, so the client's own retry is safe."""
    svc = services()
    tenant_id = current_tenant()
    try:
        slot = WaitSlot(svc, tenant_id)
    except NoWaitSlot as refused:
        raise OpenAIError(
            429,
            f"Too many requests held open ({refused.cap} cap: {refused.limit}); no job was "
            "made: retry shortly, or submit with POST /v1/jobs and poll.",
            code="rate_limit_exceeded",
            headers={"Retry-After": "5"},
        ) from None
    try:
        made = submit(request_data)
        job = made.job
        job_id = job.id
        if not job.status.terminal:
            close_request_session()
            job = wait_for_finish(svc, tenant_id, job_id, svc.settings.max_wait, slot)
    finally:
        slot.release()
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
    return {"created": created, "data": _image_data(job, response_format)}, 200, headers


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
    @blp.response(200, ImagesResponseSchema, headers=JOB_ID_HEADER)
    @answers(
        blp,
        """
        400 The body is not JSON (`invalid_request_error`).
        401 No or bad API key (`authentication_error`).
        415 A body without `Content-Type: application/json`; `error.param` names it.
        422 A parameter breaks a limit, or the body is nested deeper than 32 levels
            or holds a number JSON has not; `error.param` names it.
        429 Over the key's rate or the tenant's cap; Retry-After.
        500 The job failed or was canceled; `error.code` is the job's error code.
        504 Not finished within DIFFQ_MAX_WAIT seconds. The job keeps running:
            `error.message` and the `diffq-job-id` header name it.
        """,
    )
    def post(self, body):
        """Create images (OpenAI-compatible)

        Synchronous: answers with the images once the job finishes, like OpenAI's
        `images.generate`. The job is an ordinary diffq job (see `GET /v1/jobs`).
        """
        return _answered(_job_request(body), body["response_format"])


@blp.route("/edits")
class Edits(MethodView):
    @blp.doc(requestBody=EDIT_BODY)
    @blp.response(200, ImagesResponseSchema, headers=JOB_ID_HEADER)
    @answers(
        blp,
        """
        401 No or bad API key (`authentication_error`).
        413 Past DIFFQ_INPUT_MAX_BYTES.
        422 A parameter breaks a limit, an image that is not a PNG, JPEG or WebP
            image, or a mask of another size; `error.param` names it.
        429 Over the key's rate or the tenant's cap; Retry-After.
        500 The job failed or was canceled; `error.code` is the job's error code.
        504 Not finished within DIFFQ_MAX_WAIT seconds.
        """,
    )
    def post(self):
        """Edit an image (OpenAI-compatible)

        Like OpenAI's `images.edit`: `image` is the picture, `mask` (optional) is a PNG of
        the same size whose fully transparent pixels mark what to redraw (OpenAI's
        convention; diffq's own `mask` is white where it redraws). Without a mask, the
        image's own transparent pixels mark it; an image with none is redrawn whole (an
        `img2img` job, `strength` 0.75). It becomes an ordinary `inpaint` (or `img2img`)
        job, waited for.
        """
        body = _edit_form()
        image, mask = _edit_inputs(request.files)
        # Checked here, stored only once the job is accepted (app/web/inputs.py).
        if mask is None and image.mode != "RGBA":
            fields = {"kind": "img2img", "image": checked_png(image, field="image")}
        else:
            mask = mask if mask is not None else _transparent(image)
            fields = {
                "kind": "inpaint",
                "image": checked_png(image.convert("RGB"), field="image"),
                "mask": checked_png(mask, field="mask"),
            }
        return _answered(_job_request(body, **fields), body["response_format"])


def _edit_form() -> dict[str, Any]:
    """The edit's fields, from its multipart form."""
    if request.mimetype != "multipart/form-data":
        raise OpenAIError(
            415,
            "Send the edit as multipart/form-data (fields `prompt`, `image`, `mask`, ...).",
            param="Content-Type",
        )
    try:
        return ImagesEditSchema().load(request.form.to_dict())
    except ma.ValidationError as exc:
        field, problems = next(iter(exc.messages.items()))
        text = " ".join(str(p) for p in problems) if isinstance(problems, list) else str(problems)
        raise OpenAIError(422, f"{field}: {text}", param=field, code="invalid_value") from exc


def _edit_inputs(files) -> tuple[Any, Any]:
    """The edit's image (the first of `image` or `image[]`) and its mask turned into
    diffq's convention (white redraws), each checked as an upload is."""
    from PIL import Image

    parts = files.getlist("image") or files.getlist("image[]")
    if not parts:
        raise OpenAIError(422, "image: Missing data for required field.", param="image")
    checked = []
    for field, part in (("image", parts[0]), ("mask", files.get("mask"))):
        if part is None:
            checked.append(None)
            continue
        try:
            stored = uploads.decode(
                part.read(), field=field, max_pixels=services().settings.input_max_pixels
            )
        except InputRefused as refused:
            raise OpenAIError(
                refused.status, f"{field}: {refused.message}", param=field, code="invalid_value"
            ) from refused
        checked.append(Image.open(io.BytesIO(stored.png)))
    image, mask = checked
    if mask is not None:
        if mask.size != image.size:
            raise OpenAIError(
                422,
                f"mask: Must be the image's size, {image.width}x{image.height} "
                f"(it is {mask.width}x{mask.height}).",
                param="mask",
                code="invalid_value",
            )
        mask = _transparent(mask)
    return image, mask


def _transparent(image):
    """OpenAI's mask convention in diffq's: a fully transparent pixel redraws (white)."""
    alpha = image.convert("RGBA").getchannel("A")
    return alpha.point(lambda value: 255 if value == 0 else 0)
