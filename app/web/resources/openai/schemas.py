"""Request and response schemas of POST /v1/images/generations (OpenAI Images API)."""

from __future__ import annotations

import marshmallow as ma
from marshmallow import fields, validate

from app.rules import MAX_SEED

SIZE_PATTERN = r"^[1-9][0-9]{0,4}x[1-9][0-9]{0,4}$"
RESPONSE_FORMATS = ("url", "b64_json")
MAX_N = 10  # OpenAI's own limit; the model's `max_num_images` applies too


class ImagesGenerateSchema(ma.Schema):
    prompt = fields.String(
        required=True,
        metadata={"description": "What to draw. Limit: the model's `max_prompt_chars`."},
    )
    model = fields.String(
        load_default=None,
        validate=validate.Length(max=100),
        metadata={
            "description": "A diffq model name, or an OpenAI one (`dall-e-2`, `dall-e-3`, "
            "`gpt-image-1`, `gpt-image-1-mini`), which means the default model. Default: the "
            "default model."
        },
    )
    n = fields.Integer(
        strict=True,
        load_default=1,
        validate=validate.Range(min=1, max=MAX_N),
        metadata={"description": "Images to make, 1..the model's `max_num_images`."},
    )
    size = fields.String(
        load_default=None,
        validate=validate.Regexp(SIZE_PATTERN, error="Must be WIDTHxHEIGHT, like 512x512."),
        metadata={
            "description": "`WIDTHxHEIGHT` within the model's limits (multiples of 8). "
            "Default: the model's default size."
        },
    )
    response_format = fields.String(
        load_default="url",
        validate=validate.OneOf(RESPONSE_FORMATS),
        metadata={"description": "`url`: short-lived download links; `b64_json`: the PNGs inline."},
    )
    user = fields.String(
        load_default=None,
        validate=validate.Length(max=256),
        metadata={"description": "Your end user's id; kept in the job's `metadata.user`."},
    )
    quality = fields.String(
        validate=validate.Length(max=20),
        metadata={"description": "Accepted for compatibility and ignored (use `steps`)."},
    )
    style = fields.String(
        validate=validate.Length(max=20),
        metadata={"description": "Accepted for compatibility and ignored."},
    )
    # diffq's own parameters, sent by OpenAI clients through `extra_body`.
    seed = fields.Integer(
        strict=True,
        validate=validate.Range(min=0, max=MAX_SEED),
        metadata={"description": "diffq extension: the seed (repeatable images; result cache)."},
    )
    steps = fields.Integer(strict=True, metadata={"description": "diffq extension."})
    negative_prompt = fields.String(metadata={"description": "diffq extension."})
    guidance_scale = fields.Float(allow_nan=False, metadata={"description": "diffq extension."})


class ImageDataSchema(ma.Schema):
    url = fields.String(metadata={"description": "With `response_format=url`; expires."})
    b64_json = fields.String(metadata={"description": "With `response_format=b64_json`."})
    revised_prompt = fields.String(allow_none=True, metadata={"description": "Always null."})


class ImagesResponseSchema(ma.Schema):
    created = fields.Integer(metadata={"description": "Unix seconds when the job was made."})
    data = fields.List(fields.Nested(ImageDataSchema))
