"""Request and response schemas of /v1/videos (OpenAI Videos API)."""

from __future__ import annotations

import marshmallow as ma
from marshmallow import fields, validate

from app.web.openapi import OpenAIList
from app.web.resources.jobs.schemas import prompt_field
from app.web.resources.openai.schemas import model_field, seed_field, size_field

MAX_SECONDS = 600  # past any model's max_frames; each model's own limit is checked after


class VideoCreateSchema(ma.Schema):
    """The body's fields (JSON, or the form fields of a multipart body)."""

    prompt = prompt_field("What the clip shows. Limit: the model's `max_prompt_chars`.")
    model = model_field(
        "A diffq video model, or an OpenAI one (`sora-2`, `sora-2-pro`), which means the "
        "default video model."
    )
    seconds = fields.Float(
        load_default=None,
        allow_nan=False,
        validate=validate.Range(min=0, min_inclusive=False, max=MAX_SECONDS),
        metadata={
            "description": "Clip length, a number (OpenAI's clients send it as a string: "
            '"4"): rounded to the model\'s frame rule at its fps (Wan: 4k + 1 frames at 16 '
            "fps, LTX-Video: 8k + 1 at 24), within its `max_frames`. Default: the model's "
            "`default_frames`.",
            "example": "2",
        },
    )
    size = size_field(
        "832x480",
        "`WIDTHxHEIGHT` within the model's limits and multiples (Wan 16, LTX-Video 32). "
        "Default: the model's default size, or the shape of `input_reference`.",
    )
    # diffq's own parameters, sent by OpenAI clients through `extra_body`.
    seed = seed_field("repeatable clips")
    steps = fields.Integer(metadata={"description": "diffq extension: denoising steps."})
    negative_prompt = fields.String(metadata={"description": "diffq extension."})
    guidance_scale = fields.Float(allow_nan=False, metadata={"description": "diffq extension."})
    fps = fields.Integer(
        metadata={"description": "diffq extension: frames per second (default the model's)."}
    )


class VideoErrorSchema(ma.Schema):
    code = fields.String()
    message = fields.String()


class VideoSchema(ma.Schema):
    id = fields.String(metadata={"description": "The job's id (also `GET /v1/jobs/{id}`)."})
    object = fields.String(metadata={"example": "video"})
    model = fields.String()
    status = fields.String(
        metadata={"description": "queued, in_progress, completed or failed (canceled too)."}
    )
    progress = fields.Integer(metadata={"description": "0..100, by denoising step."})
    created_at = fields.Integer(metadata={"description": "Unix seconds."})
    completed_at = fields.Integer(allow_none=True)
    expires_at = fields.Integer(
        allow_none=True,
        metadata={"description": "When the files are removed (DIFFQ_RESULT_RETENTION)."},
    )
    prompt = fields.String(allow_none=True)
    seconds = fields.String(metadata={"description": "frames / fps", "example": "2.0625"})
    size = fields.String(metadata={"example": "832x480"})
    error = fields.Nested(VideoErrorSchema, allow_none=True)
    remixed_from_video_id = fields.String(allow_none=True)


class VideoListQuerySchema(ma.Schema):
    after = fields.UUID(metadata={"description": "The last id of the previous page."})
    limit = fields.Integer(load_default=20, validate=validate.Range(min=1, max=100))
    order = fields.String(load_default="desc", validate=validate.OneOf(("asc", "desc")))


class VideoListSchema(OpenAIList):
    data = fields.List(fields.Nested(VideoSchema))


class VideoDeletedSchema(ma.Schema):
    id = fields.String()
    object = fields.String(metadata={"example": "video.deleted"})
    deleted = fields.Boolean()
