"""Job request and response schemas; the request's limits come from the model's entry."""

from __future__ import annotations

import json
from typing import Any

import marshmallow as ma
from marshmallow import fields, validate

from app.addons import ADDONS
from app.addons.base import Lookup
from app.addons.controlnet import control as control_rules
from app.addons.lora.checks import SCALE_LIMIT
from app.jobs.changes import EVENT_TYPES
from app.jobs.states import JobStatus, Priority
from app.jobs.view import JobSchema
from app.kinds import DEFAULT_KIND, KINDS
from app.quality import TIERS
from app.rules import MAX_SEED, OUTPUT_FORMATS, SCHEDULERS, model_limit_errors
from app.uploads import InputRefused
from app.web.auth import current_tenant
from app.web.inputs import resolve as resolve_input
from app.web.services import request_session, services
from app.web.strings import RefusesNul
from app.webhooks.guard import MAX_URL_LENGTH, UnsafeUrl, check_url_at_submit, parse_allow_list

METADATA_MAX_BYTES = 2048
MAX_CANCEL_AFTER = 7 * 24 * 3600


def prompt_field(description: str) -> fields.String:
    """A required, non-empty prompt (its length is the model's rule, checked later)."""
    return fields.String(
        required=True,
        validate=validate.Length(min=1, error="Must not be empty."),
        metadata={"description": description},
    )


class LoraSchema(RefusesNul, ma.Schema):
    """One adapter of a job's `loras`: yours by `id`, or a shared one by `name`."""

    id = fields.UUID(
        load_default=None,
        metadata={
            "description": "An adapter's id (`POST /v1/adapters`).",
            "example": "01937c52-5d0e-7b9a-8e0f-6a2b4c1d9e33",
        },
    )
    name = fields.String(
        load_default=None,
        validate=validate.Length(min=1, max=200),
        metadata={"description": "A shared adapter of the catalog (`[adapters.NAME]`)."},
    )
    scale = fields.Float(
        load_default=1.0,
        allow_nan=False,
        validate=validate.Range(min=-SCALE_LIMIT, max=SCALE_LIMIT),
        metadata={
            "description": f"How strongly it applies, {-SCALE_LIMIT}..{SCALE_LIMIT}; default 1.",
            "example": 0.8,
        },
    )

    @ma.validates_schema
    def _one_of(self, data: dict[str, Any], **_kwargs) -> None:
        if (data.get("id") is None) == (data.get("name") is None):
            raise ma.ValidationError("Give one of `id` or `name`.", "id")


class ControlSchema(RefusesNul, ma.Schema):
    """One control of a job's `controls`: a ControlNet of the catalog and its image."""

    controlnet = fields.String(
        required=True,
        validate=validate.Length(min=1, max=200),
        metadata={
            "description": "A ControlNet of the catalog (`[controlnets.NAME]`, listed by "
            "`GET /v1/models` for each model it fits).",
            "example": "canny",
        },
    )
    image = fields.String(
        required=True,
        metadata={
            "description": "The control image: an upload's id (`POST /v1/uploads`) or a "
            "`data:` URI of a PNG, JPEG or WebP image. Resized to the output's size.",
            "example": "01a1f3c2-7b7e-7c4d-9a59-3f2f0d1c8e11",
        },
    )
    scale = fields.Float(
        load_default=1.0,
        allow_nan=False,
        validate=validate.Range(min=0.0, max=control_rules.SCALE_LIMIT),
        metadata={
            "description": "How strongly it steers, 0..2; default 1.",
            "example": 0.8,
        },
    )
    start = fields.Float(
        load_default=0.0,
        allow_nan=False,
        validate=validate.Range(min=0.0, max=1.0),
        metadata={"description": "The fraction of the steps it starts at, 0..1; default 0."},
    )
    end = fields.Float(
        load_default=1.0,
        allow_nan=False,
        validate=validate.Range(min=0.0, max=1.0),
        metadata={
            "description": "The fraction of the steps it stops at, above `start`; default 1."
        },
    )
    preprocess = fields.String(
        load_default="none",
        validate=validate.OneOf(control_rules.PREPROCESSORS),
        metadata={
            "description": "`none`: the image is the condition already (an edge or depth "
            "map); `canny`: its Canny edges, computed by the worker.",
            "example": "canny",
        },
    )


class _JobCreateFields(RefusesNul, ma.Schema):
    """The fields every job kind takes; JobCreateSchema adds each kind's own."""

    kind = fields.String(
        load_default=DEFAULT_KIND,
        validate=validate.OneOf(list(KINDS)),
        metadata={
            "description": "What the job does: "
            + "; ".join(f"`{k.name}`: {k.summary}" for k in KINDS.values())
            + f" Default `{DEFAULT_KIND}`."
        },
    )
    prompt = prompt_field("What to draw. Limit: the model's `max_prompt_chars`.")
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
    quality = fields.String(
        validate=validate.OneOf(TIERS),
        metadata={
            "description": "The quality tier: `exact` (the model as loaded; the only tier "
            "replayed byte for byte), `balanced` or `fast` (a step cache and guidance "
            "skipped on late steps, as the model's tier table sets: `GET /v1/models`). One "
            "of the model's tiers; default: the model's `default_quality`. Part of the "
            "cache key and the manifest.",
            "example": "balanced",
        },
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
    loras = fields.List(
        fields.Nested(LoraSchema),
        load_default=None,
        metadata={
            "description": "LoRA adapters to run with, applied together in this order: "
            '`[{"id": …, "scale": 0.8}]` (yours) or `[{"name": …}]` (shared). At most '
            "the model's `max_loras`; each must fit the model's family. Every kind takes "
            "them; they are part of the cache key and the manifest.",
            "example": [{"id": "01937c52-5d0e-7b9a-8e0f-6a2b4c1d9e33", "scale": 0.8}],
        },
    )
    controls = fields.List(
        fields.Nested(ControlSchema),
        load_default=None,
        metadata={
            "description": "ControlNet conditioning, applied together: "
            '`[{"controlnet": "canny", "image": …, "scale": 0.8, "preprocess": "canny"}]`. '
            "At most the model's `max_controls`; each ControlNet must fit the model's "
            "family. Image kinds only (txt2img, img2img, inpaint); part of the cache key "
            "and the manifest.",
            "example": [{"controlnet": "canny", "image": "data:image/png;base64,…"}],
        },
    )
    cancel_after = fields.Integer(
        strict=True,
        load_default=None,
        validate=validate.Range(min=1, max=MAX_CANCEL_AFTER),
        metadata={
            "description": "Seconds from the submit: a job not finished by then is canceled "
            "(reason `deadline`): one still queued never reaches a GPU, one running stops at "
            f"its next step. 1..{MAX_CANCEL_AFTER}."
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
            check_url_at_submit(value, parse_allow_list(services().settings.webhook_allow_cidrs))
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
        kind = KINDS.get(data.get("kind", DEFAULT_KIND))
        if kind is None:
            return  # the kind field's own error says why
        own = set(kind.api_fields())
        foreign = sorted(n for n in _KIND_FIELDS - own if data.get(n) is not None)
        if foreign:
            message = f"Not a field of kind '{kind.name}'."
            raise ma.ValidationError({name: [message] for name in foreign})
        catalog = services().catalog
        spec = catalog.get(data.get("model"))
        if spec is None:
            names = ", ".join(sorted(catalog.models))
            raise ma.ValidationError({"model": [f"Unknown model. Available: {names}."]})
        if kind.name not in spec.kinds:
            offered = ", ".join(spec.kinds)
            raise ma.ValidationError(
                {"kind": [f"Model '{spec.name}' offers the kinds: {offered}."]}
            )
        errors = _resolve_inputs(kind, data)
        addon_errors = _resolve_addons(kind, spec, data)
        if not errors:
            width, height = kind.default_size(spec, data)
            data.setdefault("width", width)
            data.setdefault("height", height)
        for field, messages in model_limit_errors(spec, data).items():
            errors.setdefault(field, []).extend(messages)
        for field, messages in kind.limit_errors(spec, data).items():
            errors.setdefault(field, []).extend(messages)
        if errors or addon_errors:
            raise ma.ValidationError({**errors, **addon_errors})
        data["_spec"] = spec  # for _normalize: the model is looked up once

    @ma.post_load
    def _normalize(self, data: dict[str, Any], **_kwargs) -> dict[str, Any]:
        """The submission's parts (app/jobs/submit.py `Submission`), the request typed."""
        spec = data.pop("_spec")  # _model_limits ran first
        return {
            "inputs": tuple(data.pop("_keep", ())),  # kept once accepted (app/web/inputs.py)
            "spec": spec,
            "request": KINDS[data["kind"]].normalize(spec, data),
            "metadata": data.get("metadata"),
            "cancel_after": data.get("cancel_after"),
            "webhook": data.get("webhook"),
            "webhook_events": data.get("webhook_events"),
            "cache": data["cache"],
            "seeded": data.get("seed") is not None,
        }


def _resolve_inputs(kind, data: dict[str, Any]) -> dict[str, list[str]]:
    """Each input image field's image (an upload's, or a data: URI's, checked), in place
    of what the body said; what keeping them takes under `_keep` (nothing is stored
    until the request is accepted: app/web/inputs.py); the refusals by field."""
    errors: dict[str, list[str]] = {}
    keeps = data["_keep"] = []
    for name in kind.image_fields:
        value = data.get(name)
        if value is None:
            continue
        try:
            data[name], needs = resolve_input(value, field=name)
            keeps.append(needs)
        except InputRefused as refused:
            errors[name] = [refused.message]
    return errors


def _resolve_addons(kind, spec, data: dict[str, Any]) -> dict[str, Any]:
    """Each add-on's values as the job keeps them (app/addons: adapters by digest,
    controls with their images' digests), in place of what the body said; what keeping
    their input images takes joins `_keep`; the refusals under each add-on's field."""
    errors: dict[str, Any] = {}
    lookup = None
    for name, addon in ADDONS.items():
        values = data.get(name) or []
        if not values:
            data[name] = ()
            continue
        if lookup is None:
            lookup = Lookup(
                services().catalog,
                request_session(),
                current_tenant(),
                lambda value, field: resolve_input(value, field=field),
            )
        done = addon.resolve(spec, kind, values, lookup)
        if done.errors:
            errors[name] = done.errors
            continue
        data[name] = done.items
        data["_keep"].extend(done.keeps)
    return errors


# Fields that belong to some kind: each is refused on a request of another kind.
_KIND_FIELDS = {name for kind in KINDS.values() for name in kind.api_fields()}
# POST /v1/jobs: the shared fields and every kind's own (each documented with its kind).
JobCreateSchema = type(
    "JobCreateSchema",
    (_JobCreateFields,),
    {name: field for kind in KINDS.values() for name, field in kind.api_fields().items()},
)


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
            "when it is not done by then. Either way it is the same single job. N is a whole "
            "number of seconds; anything else after `wait=` is a 422; other preferences are "
            "ignored.",
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
