"""Job request and response schemas; the request's limits come from the model's entry."""

from __future__ import annotations

import json
from typing import Any

import marshmallow as ma
from marshmallow import fields, validate

from app.jobs.states import JobStatus, Priority
from app.jobs.view import JobSchema
from app.rules import MAX_SEED, OUTPUT_FORMATS, SCHEDULERS, model_limit_errors, normalize
from app.web.services import services
from app.web.strings import RefusesNul
from app.webhooks.events import EVENT_TYPES
from app.webhooks.guard import MAX_URL_LENGTH, UnsafeUrl, check_url, parse_allow_list

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
        metadata={"description": f"One of the model's schedulers: {', '.join(SCHEDULERS)}."}
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


# --- Responses: the job object is app/jobs/view.py's (the webhook worker dumps it too)


class JobPageSchema(ma.Schema):
    data = fields.List(fields.Nested(JobSchema))
    next_cursor = fields.String(allow_none=True)
