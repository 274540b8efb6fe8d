"""Request and response schemas of POST /v1/images/generations (OpenAI Images API)."""

from __future__ import annotations

import marshmallow as ma
from marshmallow import fields, validate

from app.rules import MAX_SEED

SIZE_PATTERN = r"^[1-9][0-9]{0,4}x[1-9][0-9]{0,4}$"
RESPONSE_FORMATS = ("url", "b64_json")
MAX_N = 10  # OpenAI's own limit; the model's `max_num_images` applies too


def model_field(description: str) -> fields.String:
    """`model`: a diffq model or one of OpenAI's names (which mean the default)."""
    return fields.String(
        load_default=None, validate=validate.Length(max=100), metadata={"description": description}
    )


def size_field(example: str, description: str) -> fields.String:
    """`size`: its form checked here, the model's limits by the job's own checks."""
    error = f"Must be WIDTHxHEIGHT, like {example}."
    return fields.String(
        load_default=None,
        validate=validate.Regexp(SIZE_PATTERN, error=error),
        metadata={"description": description},
    )


def seed_field(what: str, *, strict: bool = False) -> fields.Integer:
    """diffq's `seed`, sent by OpenAI clients through `extra_body`."""
    return fields.Integer(
        strict=strict,
        validate=validate.Range(min=0, max=MAX_SEED),
        metadata={"description": f"diffq extension: the seed ({what})."},
    )


def count_field(*, strict: bool) -> fields.Integer:
    """`n` (a form sends it as text: not strict there)."""
    return fields.Integer(
        strict=strict,
        load_default=1,
        validate=validate.Range(min=1, max=MAX_N),
        metadata={"description": "Images to make, 1..the model's `max_num_images`."},
    )


class ImagesGenerateSchema(ma.Schema):
    prompt = fields.String(
        required=True,
        metadata={"description": "What to draw. Limit: the model's `max_prompt_chars`."},
    )
    model = model_field(
        "A diffq model name, or an OpenAI one (`dall-e-2`, `dall-e-3`, `gpt-image-1`, "
        "`gpt-image-1-mini`), which means the default model. Default: the default model."
    )
    n = count_field(strict=True)
    size = size_field(
        "512x512",
        "`WIDTHxHEIGHT` within the model's limits (multiples of 8). Default: the model's "
        "default size.",
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
        metadata={
            "description": "Mapped onto the model's quality tiers (diffq's `quality`): "
            "`low` to `fast`, `medium` to `balanced`, `high` and `hd` to `exact`, "
            "`standard` and `auto` to the model's default; a tier the model does not offer "
            "gives its default.",
            "example": "medium",
        },
    )
    style = fields.String(
        validate=validate.Length(max=20),
        metadata={"description": "Accepted for compatibility and ignored."},
    )
    # diffq's own parameters, sent by OpenAI clients through `extra_body`.
    seed = seed_field("repeatable images; result cache", strict=True)
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


class ImagesEditSchema(ma.Schema):
    """The form fields of POST /v1/images/edits (the files are `image` and `mask`)."""

    class Meta:
        unknown = ma.EXCLUDE  # the form also carries the files' own fields

    prompt = fields.String(
        required=True, metadata={"description": "What to draw where the image is edited."}
    )
    model = ImagesGenerateSchema._declared_fields["model"]
    n = count_field(strict=False)
    size = size_field(
        "512x512",
        "`WIDTHxHEIGHT` within the model's limits. Default: the image's size, fitted to "
        "the model's limits.",
    )
    response_format = ImagesGenerateSchema._declared_fields["response_format"]
    user = ImagesGenerateSchema._declared_fields["user"]
    quality = ImagesGenerateSchema._declared_fields["quality"]
    background = fields.String(
        validate=validate.Length(max=20),
        metadata={"description": "Accepted for compatibility and ignored."},
    )
    input_fidelity = fields.String(
        validate=validate.Length(max=20),
        metadata={"description": "Accepted for compatibility and ignored."},
    )
    # diffq's own parameters, sent by OpenAI clients through `extra_body`.
    strength = fields.Float(
        allow_nan=False,
        validate=validate.Range(min=0.0, max=1.0),
        metadata={
            "description": "diffq extension: how much is redrawn, 0..1 (default 1.0 with a "
            "mask or transparency, 0.75 for a whole-image edit)."
        },
    )
    seed = seed_field("repeatable images; result cache")
    steps = fields.Integer(metadata={"description": "diffq extension."})
    negative_prompt = fields.String(metadata={"description": "diffq extension."})
    guidance_scale = fields.Float(allow_nan=False, metadata={"description": "diffq extension."})
