"""/v1/videos: the OpenAI Videos API over diffq's video jobs.

`POST /v1/videos` (JSON or multipart, as OpenAI's clients send it) makes an ordinary
`txt2vid` job, or an `img2vid` job when it carries an `input_reference` image, and answers
at once with the video object (`queued`); the client polls `GET /v1/videos/{id}` (the job's
id: `GET /v1/jobs/{id}` shows the same job with its events, webhooks and cancel) and
downloads `GET /v1/videos/{id}/content` (`variant=video`: the MP4, `thumbnail`: the poster
frame). `seconds` becomes frames at the model's fps under its frame rule
(app/kinds/video.py `frames_for_seconds`); OpenAI's model names mean the default video
model. Errors use OpenAI's envelope (app/web/resources/openai/routes.py).
"""

from __future__ import annotations

import uuid
from typing import Any

import marshmallow as ma
from flask import Response, request
from flask.views import MethodView
from sqlalchemy import select
from werkzeug.exceptions import HTTPException

from app import uploads
from app.db.models.jobs import Job
from app.db.types import utcnow
from app.jobs import transitions
from app.jobs.results import result_keys
from app.jobs.states import JobStatus
from app.kinds.video import allowed_frames, frames_for_seconds
from app.uploads import InputRefused
from app.web.auth import current_tenant, require_api_key
from app.web.bodies import Blueprint, parse_json_body
from app.web.downloads import attachment
from app.web.inputs import checked_png
from app.web.openapi import BINARY, answers, form_body
from app.web.resources.jobs.submit import submit
from app.web.resources.openai.routes import (
    FIELD_NAMES,
    OpenAIError,
    _any_error,
    _http_error,
    _openai_error,
    loaded_job,
)
from app.web.resources.openai.schemas import SIZE_PATTERN
from app.web.resources.openai.video_schemas import (
    VideoCreateSchema,
    VideoDeletedSchema,
    VideoListQuerySchema,
    VideoListSchema,
    VideoSchema,
)
from app.web.services import request_session, services

blp = Blueprint(
    "openai_videos",
    __name__,
    url_prefix="/v1/videos",
    description="OpenAI-compatible video generation (`client.videos`): asynchronous, polled; "
    "each video is a diffq job of kind `txt2vid` or `img2vid`.",
)
blp.before_request(require_api_key)
blp.register_error_handler(OpenAIError, _openai_error)
blp.register_error_handler(HTTPException, _http_error)
blp.register_error_handler(Exception, _any_error)

OPENAI_VIDEO_MODELS = (
    "sora-2",
    "sora-2-pro",
    "sora-2-2025-10-06",
    "sora-2-pro-2025-10-06",
    "sora-2-2025-12-08",
)
# The job's states as OpenAI's video states.
STATUS = {
    JobStatus.QUEUED: "queued",
    JobStatus.RUNNING: "in_progress",
    JobStatus.SUCCEEDED: "completed",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELED: "failed",
}
VARIANTS = ("video", "thumbnail")
EXAMPLE = {"prompt": "a paper boat drifting down a rain gutter", "seconds": "2", "size": "64x64"}
CREATE_BODY = form_body(
    {
        "prompt": {"type": "string", "minLength": 1},
        "model": {"type": "string", "maxLength": 100},
        "seconds": {"type": "string", "pattern": r"^[0-9]{1,3}(\.[0-9]{1,3})?$", "example": "2"},
        "size": {"type": "string", "pattern": SIZE_PATTERN, "example": "64x64"},
        "input_reference": {
            **BINARY,
            "description": "The first frame: a PNG, JPEG or WebP image.",
        },
    },
    ["prompt"],
    **{"application/json": {"schema": VideoCreateSchema, "example": EXAMPLE}},
)


def video_models() -> list[str]:
    return [name for name, spec in services().catalog.models.items() if spec.video]


def _default_video_model():
    catalog = services().catalog
    default = catalog.get(None)
    if default is not None and default.video:
        return default
    for spec in catalog.models.values():
        if spec.video:
            return spec
    raise OpenAIError(
        404,
        "No video model is configured (a [models.NAME] with family wan or ltx).",
        param="model",
        code="model_not_found",
    )


def _model_for(name: str | None):
    if name is None or name in OPENAI_VIDEO_MODELS:
        return _default_video_model()
    spec = services().catalog.get(name)
    if spec is None or not spec.video:
        names = ", ".join(video_models()) or "none"
        raise OpenAIError(
            422,
            f"model: Not a video model. Video models: {names}.",
            param="model",
            code="invalid_value",
        )
    return spec


def _create_body() -> tuple[dict[str, Any], Any]:
    """The request's fields (JSON or a multipart form) and its input image, if any."""
    if request.mimetype == "multipart/form-data":
        fields = {
            k: v
            for k, v in request.form.to_dict().items()
            if isinstance(k, str) and not k.startswith("input_")  # a name not UTF-8: None
        }
        reference = request.files.get("input_reference")
        if reference is None and request.form.get("input_reference[image_url]"):
            reference = request.form["input_reference[image_url]"]
    elif request.mimetype == "application/json":
        # The API's one parser (400 or 422 naming the problem; never a RecursionError).
        fields = parse_json_body(request.get_data())
        if not isinstance(fields, dict):
            raise OpenAIError(400, "The body must be a JSON object.")
        fields = dict(fields)
        reference = fields.pop("input_reference", None)
        if isinstance(reference, dict):
            reference = reference.get("image_url") or reference.get("file_id")
    else:
        raise OpenAIError(
            415, "Send application/json or multipart/form-data.", param="Content-Type"
        )
    try:
        body = VideoCreateSchema().load(fields)
    except ma.ValidationError as exc:
        field, problems = next(iter(exc.messages.items()))
        text = " ".join(str(p) for p in problems) if isinstance(problems, list) else str(problems)
        raise OpenAIError(422, f"{field}: {text}", param=field, code="invalid_value") from exc
    return body, reference


def _reference_image(reference: Any) -> Any:
    """`input_reference` as the job's `image` field: an uploaded file checked as an upload
    is; a string (an upload's id, or a `data:` URI) is the job's own field."""
    if isinstance(reference, str):
        return reference
    import io

    from PIL import Image

    try:
        stored = uploads.decode(
            reference.read(),
            field="input_reference",
            max_pixels=services().settings.input_max_pixels,
        )
    except InputRefused as refused:
        raise OpenAIError(
            refused.status,
            f"input_reference: {refused.message}",
            param="input_reference",
            code="invalid_value",
        ) from refused
    return checked_png(Image.open(io.BytesIO(stored.png)), field="input_reference")


def _job_request(body: dict[str, Any], reference: Any) -> dict[str, Any]:
    spec = _model_for(body.get("model"))
    job: dict[str, Any] = {"prompt": body["prompt"], "model": spec.name, "kind": "txt2vid"}
    if reference is not None:
        job["kind"] = "img2vid"
        job["image"] = _reference_image(reference)
    if body.get("seconds") is not None:
        frames = frames_for_seconds(spec, body["seconds"], body.get("fps"))
        if frames > spec.max_frames:
            most = (spec.max_frames - 1) / (body.get("fps") or spec.fps)
            raise OpenAIError(
                422,
                f"seconds: At most {most:g} seconds for model '{spec.name}' at "
                f"{body.get('fps') or spec.fps} fps ({allowed_frames(spec)} frames).",
                param="seconds",
                code="invalid_value",
            )
        job["num_frames"] = frames
    if body.get("size"):
        width, _, height = body["size"].partition("x")
        job["width"], job["height"] = int(width), int(height)
    for name in ("seed", "steps", "negative_prompt", "guidance_scale", "fps"):
        if body.get(name) is not None:
            job[name] = body[name]
    return loaded_job(job, {**FIELD_NAMES, "num_frames": "seconds", "image": "input_reference"})


def video_object(job: Job) -> dict[str, Any]:
    """A job as OpenAI's video object."""
    stored = job.input or {}
    frames, fps = stored.get("num_frames") or 0, stored.get("fps") or 1
    retention = services().settings.result_retention
    finished = int(job.finished_at.timestamp()) if job.finished_at else None
    error = None
    if job.status in (JobStatus.FAILED, JobStatus.CANCELED):
        error = {
            "code": job.error_code or job.status.value,
            "message": job.error_message or f"the job was {job.status.value}",
        }
    progress = (job.progress or {}).get("percent") or 0
    return {
        "id": str(job.id),
        "object": "video",
        "model": job.model,
        "status": STATUS[job.status],
        "progress": 100 if job.status == JobStatus.SUCCEEDED else int(progress),
        "created_at": int(job.created_at.timestamp()),
        "completed_at": finished if job.status == JobStatus.SUCCEEDED else None,
        "expires_at": finished + int(retention)
        if finished and retention > 0 and job.status == JobStatus.SUCCEEDED
        else None,
        "prompt": stored.get("prompt"),
        "seconds": f"{frames / fps:g}",
        "size": f"{stored.get('width')}x{stored.get('height')}",
        "error": error,
        "remixed_from_video_id": None,
    }


def _video(job_id: uuid.UUID) -> Job:
    """The tenant's video job (not deleted), or a 404."""
    job = request_session().scalar(
        select(Job).where(
            Job.id == job_id,
            Job.tenant_id == current_tenant(),
            Job.model.in_(video_models()),
            Job.data_removed_at.is_(None),
        )
    )
    if job is None:
        # The same answer for another tenant's video as for none (nothing to tell apart).
        raise OpenAIError(404, "No such video.", code="not_found")
    return job


@blp.route("")
class Videos(MethodView):
    @blp.doc(requestBody=CREATE_BODY)
    @blp.response(200, VideoSchema)
    @answers(
        blp,
        """
        401 No or bad API key (`authentication_error`).
        415 Neither JSON nor multipart; `error.param` names it.
        422 `seconds`, `size` or another field outside the model's rules, a model
            that makes no video, or an `input_reference` that is not an image or is
            too large; `error.param` names it and the message the allowed values.
            Nothing is queued.
        429 Over the key's rate or the tenant's cap; Retry-After.
        """,
    )
    def post(self):
        """Create a video (OpenAI-compatible)

        Queues a clip and answers at once with the video object (`status: queued`), as
        OpenAI's `videos.create` expects; `videos.create_and_poll` then polls it. `seconds`
        is rounded to the model's frame rule at its fps (for example 2 s at 16 fps on Wan:
        33 frames); `size` is `WIDTHxHEIGHT` within the model's limits. With an
        `input_reference` image the clip starts from it (`img2vid`): an image of another
        shape is cropped to the clip's around its centre, then resized. diffq extensions
        (`extra_body`): `seed`, `steps`, `negative_prompt`, `guidance_scale`, `fps`.
        """
        body, reference = _create_body()
        made = submit(_job_request(body, reference))
        return video_object(made.job)

    @blp.arguments(VideoListQuerySchema, location="query")
    @blp.response(200, VideoListSchema)
    @blp.alt_response(401, description="No or bad API key (`authentication_error`).")
    @blp.alt_response(
        422, description="`after` that is no video id, or `limit`/`order` out of range."
    )
    def get(self, args):
        """List your videos (OpenAI-compatible)

        Newest first (`order=desc`, the default) or oldest first; `after`: the last id of
        the previous page.
        """
        query = select(Job).where(
            Job.tenant_id == current_tenant(),
            Job.model.in_(video_models()),
            Job.data_removed_at.is_(None),
        )
        descending = args["order"] == "desc"
        if "after" in args:
            after = args["after"]
            query = query.where(Job.id < after if descending else Job.id > after)
        order = Job.id.desc() if descending else Job.id.asc()
        limit = args["limit"]
        rows = list(request_session().scalars(query.order_by(order).limit(limit + 1)))
        page = [video_object(job) for job in rows[:limit]]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(rows) > limit,
        }


@blp.route("/<uuid:video_id>")
class VideoById(MethodView):
    @blp.response(200, VideoSchema)
    @blp.alt_response(404, description="No such video (or not yours, or deleted).")
    def get(self, video_id: uuid.UUID):
        """Get a video (OpenAI-compatible)

        Its status (`queued`, `in_progress`, `completed`, `failed`) and `progress` (0..100,
        by denoising step).
        """
        return video_object(_video(video_id))

    @blp.response(200, VideoDeletedSchema)
    @blp.alt_response(404, description="No such video (or not yours, or deleted).")
    @blp.alt_response(
        409,
        description="Still queued or in progress: cancel it first (`POST /v1/jobs/{id}/cancel`).",
    )
    def delete(self, video_id: uuid.UUID):
        """Delete a video (OpenAI-compatible)

        Removes a finished video's MP4 and poster from the store; the video is gone from
        `/v1/videos` (its job stays in `/v1/jobs`, marked `data_removed`).
        """
        job = _video(video_id)
        if not job.status.terminal:
            raise OpenAIError(
                409,
                f"Video {job.id} is {STATUS[job.status]}: cancel it first "
                f"(POST /v1/jobs/{job.id}/cancel), then delete it.",
                code="video_not_finished",
            )
        storage = services().storage
        if not job.cached_from:  # a cached copy's files are its source's
            for key in result_keys(job.result):
                storage.delete(key)
        transitions.change(
            request_session(),
            job.id,
            Job.data_removed_at.is_(None),
            result=None,
            data_removed_at=utcnow(),
        )
        request_session().commit()
        return {"id": str(job.id), "object": "video.deleted", "deleted": True}


@blp.route("/<uuid:video_id>/content")
class VideoContent(MethodView):
    @blp.doc(
        parameters=[
            {
                "name": "variant",
                "in": "query",
                "schema": {"type": "string", "enum": list(VARIANTS), "default": "video"},
                "description": "`video`: the MP4; `thumbnail`: the poster (first) frame.",
            }
        ],
        responses={
            "200": {
                "description": "The file's bytes.",
                "content": {"video/mp4": {}, "image/png": {}},
            }
        },
    )
    @answers(
        blp,
        """
        404 No such video (or not yours, or deleted).
        409 Not completed yet.
        422 A variant other than `video` or `thumbnail`.
        """,
    )
    def get(self, video_id: uuid.UUID):
        """Download a video (OpenAI-compatible)

        The MP4 (H.264, yuv420p, faststart), or with `variant=thumbnail` its poster frame.
        """
        unknown = set(request.args) - {"variant"}
        if unknown:
            param = sorted(unknown)[0]
            raise OpenAIError(422, f"{param}: Unknown query parameter.", param=param)
        variant = request.args.get("variant", "video")
        if variant not in VARIANTS:
            raise OpenAIError(
                422,
                f"variant: Must be one of {', '.join(VARIANTS)}.",
                param="variant",
                code="invalid_value",
            )
        job = _video(video_id)
        if job.status != JobStatus.SUCCEEDED:
            raise OpenAIError(
                409,
                f"Video {job.id} is {STATUS[job.status]}; its content comes once completed.",
                code="video_not_ready",
            )
        files = (job.result or {}).get("videos" if variant == "video" else "images") or []
        if not files:
            raise OpenAIError(404, f"Video {job.id} has no {variant}.", code="not_found")
        entry = files[0]
        data = services().storage.get(entry["key"])
        response = Response(data, mimetype=entry["content_type"])
        extension = entry["key"].rsplit(".", 1)[-1]
        name = f"{job.id}{'' if variant == 'video' else '-thumbnail'}.{extension}"
        response.headers["Content-Disposition"] = attachment(name)
        response.headers["Cache-Control"] = "private, max-age=3600"
        return response
