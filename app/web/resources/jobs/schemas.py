"""Job request and response schemas; the request's limits come from the model's entry."""

from __future__ import annotations

import json
import secrets
from typing import Any

import marshmallow as ma
from marshmallow import fields, validate

from app.catalog import ModelSpec
from app.jobs.states import JobStatus, Priority
from app.web.services import services
from app.web.strings import RefusesNul
from app.webhooks.events import EVENT_TYPES
from app.webhooks.guard import MAX_URL_LENGTH, UnsafeUrl, check_url, parse_allow_list

MAX_SEED = 2**32 - 1
OUTPUT_FORMATS = ("png", "jpeg", "webp")
METADATA_MAX_BYTES = 2048
MAX_CANCEL_AFTER = 7 * 24 * 3600


class JobCreateSchema(RefusesNul, ma.Schema):
    prompt = fields.String(
        required=True,
        validate=validate.Length(min=1, error="Must not be empty."),
        metadata={"description": "What to draw. Limit: the model's `max_prompt_chars`."},
    )
    negative_prompt = fields.String(
        load_default=None,
        allow_none=True,
        metadata={"description": "What to steer away from."},
    )
    model = fields.String(
        load_default=None, metadata={"description": "A configured model name; default if absent."}
    )
    width = fields.Integer(
        strict=True,
        metadata={"description": "Pixels; a multiple of the model's `size_multiple` (8)."},
    )
    height = fields.Integer(strict=True, metadata={"description": "Pixels; as for width."})
    steps = fields.Integer(
        strict=True, metadata={"description": "Denoising steps, 1..the model's `max_steps`."}
    )
    guidance_scale = fields.Float(
        allow_nan=False, metadata={"description": "Classifier-free guidance, 0..`max_guidance`."}
    )
    seed = fields.Integer(
        strict=True,
        validate=validate.Range(min=0, max=MAX_SEED),
        metadata={"description": f"0..{MAX_SEED}; random if absent. Image i uses seed + i."},
    )
    num_images = fields.Integer(
        strict=True, metadata={"description": "Images in this job, 1..`max_num_images`."}
    )
    scheduler = fields.String(
        metadata={
            "description": "One of the model's schedulers: default, ddim, euler, euler_a, "
            "dpm++, pndm, lms or lcm (few-step models)."
        }
    )
    output_format = fields.String(
        load_default="png",
        validate=validate.OneOf(OUTPUT_FORMATS),
        metadata={"description": "png, jpeg or webp."},
    )
    priority = fields.String(
        load_default=Priority.NORMAL.value,
        validate=validate.OneOf([p.value for p in Priority]),
        metadata={"description": "low, normal or high."},
    )
    cancel_after = fields.Integer(
        strict=True,
        load_default=None,
        validate=validate.Range(min=1, max=MAX_CANCEL_AFTER),
        metadata={
            "description": "Seconds: a job not started by then is canceled (reason `deadline`) "
            f"and never reaches a GPU. 1..{MAX_CANCEL_AFTER}."
        },
    )
    metadata = fields.Dict(
        keys=fields.String(),
        load_default=None,
        metadata={
            "description": f"Your data, returned as given (at most {METADATA_MAX_BYTES} B of JSON)."
        },
    )

    cache = fields.Boolean(
        load_default=True,
        metadata={
            "description": "With an explicit `seed`, an earlier succeeded job of yours with the "
            "same model weights and inputs answers at once (`cached: true`, no GPU run). "
            "`false`: always generate."
        },
    )

    webhook = fields.String(
        load_default=None,
        metadata={
            "description": "An https (or http) URL to POST this job's events to, signed per "
            "Standard Webhooks with your tenant's secret. Only public addresses are called. "
            f"At most {MAX_URL_LENGTH} characters."
        },
    )
    webhook_events = fields.List(
        fields.String(validate=validate.OneOf(EVENT_TYPES)),
        load_default=None,
        validate=validate.Length(min=1, max=len(EVENT_TYPES)),
        metadata={
            "description": "Which events to send: "
            + ", ".join(EVENT_TYPES)
            + " (job.progress: at most one a second). Default: the terminal ones."
        },
    )

    @ma.validates("webhook")
    def _webhook_url(self, value: str | None, **_kwargs) -> None:
        if value is None:
            return
        try:
            check_url(value, parse_allow_list(services().settings.webhook_allow_cidrs))
        except UnsafeUrl as exc:
            raise ma.ValidationError(f"Not allowed: {exc}.") from exc

    @ma.validates("metadata")
    def _metadata_size(self, value: dict | None, **_kwargs) -> None:
        if value is not None and len(json.dumps(value)) > METADATA_MAX_BYTES:
            raise ma.ValidationError(f"At most {METADATA_MAX_BYTES} bytes of JSON.")

    @ma.validates("prompt")
    def _prompt_not_blank(self, value: str, **_kwargs) -> None:
        if not value.strip():
            raise ma.ValidationError("Must not be blank.")

    @ma.validates_schema(skip_on_field_errors=False)
    def _model_limits(self, data: dict[str, Any], **_kwargs) -> None:
        catalog = services().catalog
        spec = catalog.get(data.get("model"))
        if spec is None:
            names = ", ".join(sorted(catalog.models))
            raise ma.ValidationError({"model": [f"Unknown model. Available: {names}."]})
        errors = model_limit_errors(spec, data)
        if errors:
            raise ma.ValidationError(errors)
        data["_spec"] = spec  # for _normalize: the model is looked up once

    @ma.post_load
    def _normalize(self, data: dict[str, Any], **_kwargs) -> dict[str, Any]:
        spec = data.pop("_spec")  # _model_limits ran first
        return {
            "spec": spec,
            "params": normalize(spec, data),
            "metadata": data.get("metadata"),
            "cancel_after": data.get("cancel_after"),
            "webhook": data.get("webhook"),
            "webhook_events": data.get("webhook_events"),
            "cache": data["cache"],
            "seeded": data.get("seed") is not None,
        }


def model_limit_errors(spec: ModelSpec, data: dict[str, Any]) -> dict[str, list[str]]:
    """Every limit of the model that the request breaks, by field."""
    errors: dict[str, list[str]] = {}

    def add(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    for field, key in (("prompt", "prompt"), ("negative_prompt", "negative_prompt")):
        value = data.get(key)
        if value and len(value) > spec.max_prompt_chars:
            add(field, f"At most {spec.max_prompt_chars} characters for model '{spec.name}'.")
    for field, maximum in (("width", spec.max_width), ("height", spec.max_height)):
        value = data.get(field)
        if value is None:
            continue
        if value % spec.size_multiple or not spec.min_size <= value <= maximum:
            add(
                field,
                f"Must be a multiple of {spec.size_multiple} between {spec.min_size} and "
                f"{maximum} for model '{spec.name}'.",
            )
    width = data.get("width", spec.default_width)
    height = data.get("height", spec.default_height)
    if "width" not in errors and "height" not in errors and width * height > spec.max_pixels:
        add(
            "width",
            f"width x height = {width * height} pixels exceeds the {spec.max_pixels} "
            f"allowed for model '{spec.name}'.",
        )
    steps = data.get("steps")
    if steps is not None and not 1 <= steps <= spec.max_steps:
        add("steps", f"Must be between 1 and {spec.max_steps} for model '{spec.name}'.")
    guidance = data.get("guidance_scale")
    if guidance is not None and not 0 <= guidance <= spec.max_guidance:
        add("guidance_scale", f"Must be between 0 and {spec.max_guidance} for model '{spec.name}'.")
    count = data.get("num_images")
    if count is not None and not 1 <= count <= spec.max_num_images:
        add("num_images", f"Must be between 1 and {spec.max_num_images} for model '{spec.name}'.")
    count = data.get("num_images", 1)
    budget = spec.max_pixels_per_job
    sized = not {"width", "height", "num_images"} & set(errors)
    if budget is not None and sized and width * height * count > budget:
        message = (
            f"width x height x num_images = {width} x {height} x {count} = "
            f"{width * height * count} pixels exceeds the {budget} one job may use on "
            f"model '{spec.name}' (max_pixels_per_job): ask for fewer or smaller images."
        )
        for name in ("width", "height", "num_images"):
            add(name, message)
    scheduler = data.get("scheduler")
    if scheduler is not None and scheduler not in spec.schedulers:
        add("scheduler", f"Must be one of: {', '.join(spec.schedulers)}.")
    return errors


def normalize(spec: ModelSpec, data: dict[str, Any]) -> dict[str, Any]:
    """The request with every default filled in, including the seed that will be used."""
    seed = data.get("seed")
    return {
        "prompt": data["prompt"],
        "negative_prompt": data.get("negative_prompt"),
        "model": spec.name,
        "width": data.get("width", spec.default_width),
        "height": data.get("height", spec.default_height),
        "steps": data.get("steps", spec.default_steps),
        "guidance_scale": float(data.get("guidance_scale", spec.default_guidance)),
        "seed": seed if seed is not None else secrets.randbelow(MAX_SEED + 1),
        "num_images": data.get("num_images", 1),
        "scheduler": data.get("scheduler", "default"),
        "output_format": data["output_format"],
        "priority": data["priority"],
    }


class IdempotencyHeaderSchema(RefusesNul, ma.Schema):
    class Meta:
        unknown = ma.EXCLUDE  # every other header

    idempotency_key = fields.String(
        data_key="Idempotency-Key",
        validate=validate.Length(min=1, max=255),
        metadata={
            "description": "Any unique string (a UUID, say). Repeating a request with the same "
            "key returns the original job; reusing it with a different body is a 409."
        },
    )


class PreferHeaderSchema(ma.Schema):
    class Meta:
        unknown = ma.EXCLUDE  # every other header

    prefer = fields.String(
        data_key="Prefer",
        validate=validate.Length(max=200),
        metadata={
            "description": "`wait=N` (RFC 7240): hold the answer up to N seconds (capped by "
            "DIFFQ_MAX_WAIT, 60) and answer `200` with the finished job, or the usual `202` "
            "when it is not done by then. Either way it is the same single job.",
            "example": "wait=30",
        },
    )


class SubmitHeadersSchema(IdempotencyHeaderSchema, PreferHeaderSchema):
    pass


class JobListQuerySchema(RefusesNul, ma.Schema):
    status = fields.String(
        validate=validate.OneOf([s.value for s in JobStatus]),
        metadata={"description": "Only jobs in this state."},
    )
    limit = fields.Integer(
        load_default=20, validate=validate.Range(min=1, max=100), metadata={"description": "1..100"}
    )
    cursor = fields.String(metadata={"description": "`next_cursor` from the previous page."})


# --- Responses (documentation and dumping) ---------------------------------------


class ProgressSchema(ma.Schema):
    stage = fields.String(
        metadata={
            "description": "queued, loading, encoding_prompt, denoising, decoding, uploading, done"
        }
    )
    step = fields.Integer()
    total_steps = fields.Integer()
    percent = fields.Float()


class ImageSchema(ma.Schema):
    url = fields.String(metadata={"description": "Downloads without an API key; expires."})
    width = fields.Integer()
    height = fields.Integer()
    seed = fields.Integer()
    content_type = fields.String()
    bytes = fields.Integer()
    sha256 = fields.String(metadata={"description": "SHA-256 of the image file, hex."})


class VersionsSchema(ma.Schema):
    diffq = fields.String()
    diffusers = fields.String()
    torch = fields.String()
    transformers = fields.String()


class SchedulerManifestSchema(ma.Schema):
    class_name = fields.String(
        attribute="class", data_key="class", metadata={"example": "EulerDiscreteScheduler"}
    )
    config = fields.Dict(metadata={"description": "The scheduler's full config as run."})


class ManifestSchema(ma.Schema):
    model = fields.String()
    weights_sha256 = fields.String(
        metadata={"description": "SHA-256 over the model's weight files, computed at load."}
    )
    scheduler = fields.Nested(SchedulerManifestSchema)
    seed = fields.Integer()
    dtype = fields.String(metadata={"example": "float16"})
    device = fields.String(metadata={"example": "NVIDIA H100 80GB HBM3"})
    versions = fields.Nested(VersionsSchema)


class ResultSchema(ma.Schema):
    images = fields.List(fields.Nested(ImageSchema))
    manifest = fields.Nested(
        ManifestSchema,
        allow_none=True,
        metadata={"description": "How the images were made: enough to make them again."},
    )


class ReplaySchema(ma.Schema):
    of = fields.UUID(metadata={"description": "The job whose inputs this one ran again."})
    bytes_match = fields.Boolean(
        allow_none=True,
        metadata={
            "description": "True if every image is byte for byte the original's; null until "
            "both have finished with images."
        },
    )


class JobErrorSchema(ma.Schema):
    code = fields.String(
        metadata={
            "description": "invalid_input, invalid_message, model_unavailable, gpu_oom, timeout, "
            "storage_unavailable, dead_lettered, internal_error, content_filtered (the model's "
            "safety checker blacked out every image); for canceled jobs: canceled, "
            "deadline"
        }
    )
    message = fields.String()


class JobMetricsSchema(ma.Schema):
    queue_seconds = fields.Float(allow_none=True)
    run_seconds = fields.Float(allow_none=True)


class JobUrlsSchema(ma.Schema):
    self = fields.String()
    cancel = fields.String(metadata={"description": "POST here to cancel."})
    events = fields.String(metadata={"description": "Server-Sent Events: status and progress."})


class JobCostSchema(ma.Schema):
    gpu_seconds = fields.Float(
        metadata={
            "description": "Device seconds inside the pipeline call (not queue time, not "
            "the upload): what usage and quotas count.",
            "example": 1.8421,
        }
    )
    device = fields.String(
        metadata={"description": "The device's name, as prices name it.", "example": "cpu"}
    )
    model = fields.String(metadata={"example": "tiny"})


class JobSchema(ma.Schema):
    id = fields.UUID()
    status = fields.String(metadata={"description": "queued, running, succeeded, failed, canceled"})
    model = fields.String()
    input = fields.Dict(metadata={"description": "The normalized request, with the seed used."})
    progress = fields.Nested(ProgressSchema, allow_none=True)
    queue_position = fields.Integer(
        allow_none=True,
        metadata={
            "description": "While queued: jobs that will start before this one (0: next). "
            "Null in a submit's 202: the job's GET and its events have it."
        },
    )
    eta_seconds = fields.Float(
        allow_none=True,
        metadata={
            "description": "While queued: an estimate of the seconds until it starts, from the "
            "model's recent per-step times and the jobs ahead; null until the model has run, "
            "and in a submit's 202."
        },
    )
    priority = fields.String(metadata={"description": "low, normal or high."})
    attempts = fields.Integer()
    result = fields.Nested(ResultSchema, allow_none=True)
    error = fields.Nested(
        JobErrorSchema,
        allow_none=True,
        metadata={"description": "Why it failed, or why it was canceled (canceled, deadline)."},
    )
    created_at = fields.DateTime()
    started_at = fields.DateTime(allow_none=True)
    finished_at = fields.DateTime(allow_none=True)
    metrics = fields.Nested(JobMetricsSchema)
    urls = fields.Nested(JobUrlsSchema)
    cost = fields.Nested(
        JobCostSchema,
        allow_none=True,
        metadata={"description": "Once succeeded: what the job cost. Null before."},
    )
    metadata = fields.Dict(allow_none=True)
    data_removed = fields.Boolean(
        metadata={
            "description": "True once the images were deleted after the retention period "
            "(DIFFQ_RESULT_RETENTION); `result` is then null."
        }
    )
    webhook = fields.String(allow_none=True)
    webhook_events = fields.List(fields.String(), allow_none=True)
    cached = fields.Boolean(
        metadata={"description": "Answered from the result cache: no GPU run (see `cache`)."}
    )
    cached_from = fields.UUID(
        allow_none=True, metadata={"description": "The job whose images a cached job shares."}
    )
    replay = fields.Nested(ReplaySchema, allow_none=True)


class JobPageSchema(ma.Schema):
    data = fields.List(fields.Nested(JobSchema))
    next_cursor = fields.String(allow_none=True)
