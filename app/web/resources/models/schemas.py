"""Catalog and estimate schemas."""

from __future__ import annotations

import marshmallow as ma
from marshmallow import fields, validate

from app.kinds import DEFAULT_KIND, KINDS
from app.quality import TIERS

LIMIT_FIELDS = (
    "min_size",
    "max_width",
    "max_height",
    "max_pixels",
    "size_multiple",
    "default_width",
    "default_height",
    "max_steps",
    "default_steps",
    "max_guidance",
    "default_guidance",
    "max_num_images",
    "max_prompt_chars",
    "soft_time_limit",
)


class VideoLimitsSchema(ma.Schema):
    fps = fields.Integer(metadata={"description": "A clip's default frames per second."})
    max_fps = fields.Integer()
    default_frames = fields.Integer()
    max_frames = fields.Integer()
    frame_step = fields.Integer(
        metadata={"description": "A clip has k x frame_step + 1 frames (Wan 4, LTX-Video 8)."}
    )


class PauseSchema(ma.Schema):
    model = fields.String(metadata={"example": "sdxl"})
    paused_at = fields.String(metadata={"example": "2026-11-28T19:05:00+00:00"})
    now = fields.Boolean(
        metadata={
            "description": "Its running jobs were asked to checkpoint and go back to the "
            "queue (those that checkpoint; the others finish).",
            "example": False,
        }
    )
    reason = fields.String(allow_none=True, metadata={"example": "driver upgrade"})
    paused_by = fields.String(
        allow_none=True,
        metadata={"description": "The operator's key id, or the CLI's user.", "example": None},
    )


class PauseRequestSchema(ma.Schema):
    now = fields.Boolean(
        load_default=False,
        metadata={
            "description": "Also send its running jobs back to the queue at their next step, "
            "each with a checkpoint it resumes from (a job that checkpoints and has more than "
            "DIFFQ_SHUTDOWN_FINISH seconds left; the others finish). False: they finish.",
            "example": False,
        },
    )
    reason = fields.String(
        validate=validate.Length(max=200),
        metadata={
            "description": "Shown with the pause (200 characters at most).",
            "example": "driver upgrade",
        },
    )


class QualitySchema(ma.Schema):
    default = fields.String(
        metadata={"description": "The tier of a job that names none.", "example": "exact"}
    )
    tiers = fields.Dict(
        keys=fields.String(),
        values=fields.Dict(),
        metadata={
            "description": "The tiers a job's `quality` may name, each with what it sets: "
            "`step_cache` (`first_block` with its `threshold`, or `taylorseer` with its "
            "`interval`) and `guidance_until` (the fraction of the steps run with "
            "classifier-free guidance; absent: every step). `exact` sets nothing: the model as "
            "loaded.",
            "example": {
                "exact": {},
                "balanced": {"guidance_until": 0.8},
                "fast": {"guidance_until": 0.5},
            },
        },
    )
    psnr = fields.Dict(
        keys=fields.String(),
        values=fields.Float(),
        metadata={
            "description": "Each tier's deviation from `exact` on this model's weights, in "
            "dB (higher: closer; identical images: none), as the operator measured it with "
            "`bench.quality` and declared it in the tier's table; a tier not measured is "
            "absent.",
            "example": {"balanced": 34.2, "fast": 27.9},
        },
    )


class ModelSchema(ma.Schema):
    name = fields.String(metadata={"description": "The value of a job's `model`."})
    default = fields.Boolean(metadata={"description": "Used when a job names no model."})
    limits = fields.Dict(
        keys=fields.String(),
        metadata={
            "description": "What a job on this model may ask: "
            + ", ".join(f"`{name}`" for name in LIMIT_FIELDS)
            + " (seconds a job may run). A job beyond any of them is a 422 naming the field.",
            "example": {
                "min_size": 64,
                "max_width": 512,
                "max_height": 512,
                "max_pixels": 262144,
                "size_multiple": 8,
                "default_width": 64,
                "default_height": 64,
                "max_steps": 50,
                "default_steps": 8,
                "max_guidance": 30.0,
                "default_guidance": 7.5,
                "max_num_images": 4,
                "max_prompt_chars": 2000,
                "soft_time_limit": 120,
            },
        },
    )
    family = fields.String(
        metadata={
            "description": "The model's architecture: sd (Stable Diffusion 1.x, 2.x, SDXL), "
            "sd3 or flux (flow matching: only flow-matching schedulers); wan or ltx (video).",
            "example": "sd",
        }
    )
    quantize = fields.String(
        allow_none=True,
        metadata={
            "description": "Its denoiser's quantized weights (`int8`, `fp8`; the manifest's "
            "`quantize`); null: the model's dtype.",
            "example": None,
        },
    )
    preset = fields.String(
        allow_none=True,
        metadata={
            "description": "Its few-step preset (lcm, turbo, lightning, schnell), which "
            "set its default steps and guidance; null: none.",
            "example": None,
        },
    )
    schedulers = fields.List(fields.String(), metadata={"example": ["default", "ddim", "euler"]})
    sizes = fields.List(
        fields.String(),
        metadata={
            "description": "The size tiers (WIDTHxHEIGHT) whose jobs this model batches "
            "together; empty: every size (or no batching).",
            "example": ["512x512", "768x768"],
        },
    )
    sizes_required = fields.Boolean(
        metadata={"description": "True: a job of a size outside `sizes` is a 422."}
    )
    kinds = fields.List(
        fields.String(),
        metadata={
            "description": "The job kinds (a job's `kind`) this model offers; a job of "
            "another kind is a 422 naming `kind`.",
            "example": ["txt2img", "img2img", "inpaint"],
        },
    )
    video = fields.Nested(
        VideoLimitsSchema,
        allow_none=True,
        metadata={
            "description": "A video model's frame rules (family wan or ltx); null for "
            "an image model."
        },
    )
    lora_family = fields.String(
        allow_none=True,
        metadata={
            "description": "The add-on family its add-on weights must fit: LoRA adapters "
            "(`POST /v1/adapters`, where `max_loras` is above 0) and ControlNets; null: the "
            "model takes none. A FLUX model's (`flux`) takes FLUX LoRAs and ControlNets.",
            "example": "sd15",
        },
    )
    max_loras = fields.Integer(
        metadata={"description": "Adapters one job may name (`loras`).", "example": 4}
    )
    shared_adapters = fields.List(
        fields.String(),
        metadata={
            "description": "The catalog's shared adapters of this family: a job names them "
            "in `loras` by `name`.",
            "example": ["ink"],
        },
    )
    max_controls = fields.Integer(
        metadata={
            "description": "ControlNet controls one job may carry (`controls`).",
            "example": 2,
        }
    )
    controlnets = fields.List(
        fields.String(),
        metadata={
            "description": "The catalog's ControlNets that fit this model: a job names them "
            "in `controls` by `controlnet`.",
            "example": ["canny"],
        },
    )
    quality = fields.Nested(
        QualitySchema,
        metadata={"description": "Its quality tiers (a job's `quality`) and their settings."},
    )
    paused = fields.Nested(
        PauseSchema,
        allow_none=True,
        metadata={
            "description": "Set while an operator has paused the model: its queued jobs wait "
            "(their ETAs are null) and none starts until it is resumed; null: running."
        },
    )


class ModelListSchema(ma.Schema):
    data = fields.List(fields.Nested(ModelSchema))
    default_model = fields.String(metadata={"example": "tiny"})


class EstimateQuerySchema(ma.Schema):
    kind = fields.String(
        load_default=DEFAULT_KIND,
        validate=validate.OneOf(list(KINDS)),
        metadata={"description": f"The job's kind; `{DEFAULT_KIND}` if absent."},
    )
    width = fields.Integer(metadata={"description": "Pixels; the model's default if absent."})
    height = fields.Integer(metadata={"description": "Pixels; the model's default if absent."})
    steps = fields.Integer(metadata={"description": "The model's default if absent."})
    num_images = fields.Integer(metadata={"description": "1 if absent."})
    loras = fields.Integer(
        validate=validate.Range(min=0),
        metadata={
            "description": "How many LoRA adapters the job names (0 if absent); each adds "
            "a tenth to its work. At most the model's `max_loras`."
        },
    )
    controls = fields.Integer(
        validate=validate.Range(min=0),
        metadata={
            "description": "How many ControlNet controls the job carries (0 if absent); "
            "each adds 0.4 to its work. At most the model's `max_controls` (0 on a video "
            "kind)."
        },
    )
    quality = fields.String(
        validate=validate.OneOf(TIERS),
        metadata={
            "description": "The job's quality tier (the model's `default_quality` if "
            "absent), one the model offers. A guidance cut counts: `guidance_until` g "
            "leaves (1 + g) / 2 of the denoiser's work on a model that guides; a step "
            "cache is counted at full work (its saving depends on the weights).",
            "example": "fast",
        },
    )
    guidance_scale = fields.Float(
        allow_nan=False,
        metadata={
            "description": "The model's default if absent; at 1 or below nothing is "
            "guided, so a guidance cut saves nothing."
        },
    )
    num_frames = fields.Integer(
        metadata={
            "description": "Kinds txt2vid, img2vid: the clip's frames (the default if "
            "absent); a video's work is steps x frames x pixels."
        }
    )
    fps = fields.Integer(metadata={"description": "Kinds txt2vid, img2vid."})
    strength = fields.Float(
        allow_nan=False,
        validate=validate.Range(min=0.0, max=1.0),
        metadata={
            "description": "Kinds img2img and inpaint: the job's strength (its default if "
            "absent); `int(steps x strength)` steps run. The size is the output's (the "
            "input's, fitted, if absent: the model's default here)."
        },
    )


class EstimateSchema(ma.Schema):
    model = fields.String(metadata={"example": "tiny"})
    run_seconds = fields.Float(
        allow_none=True,
        metadata={
            "description": "Expected running time, fitted to the model's recent successes "
            "(fixed + per unit, a unit being one step of one 512x512 image). Null until the "
            "model has finished a job.",
            "example": 4.2,
        },
    )
    queue_seconds = fields.Float(
        allow_none=True,
        metadata={
            "description": "Expected wait before a worker takes a normal-priority job now.",
            "example": 0.0,
        },
    )
    queued = fields.Integer(metadata={"description": "Jobs waiting on the model's queue."})
    running = fields.Integer(metadata={"description": "Jobs running on it."})
    samples = fields.Integer(metadata={"description": "Finished jobs the fit is made from."})
    paused = fields.Boolean(
        metadata={
            "description": "The model is paused by an operator: a job would wait until it is "
            "resumed, so `queue_seconds` is null.",
            "example": False,
        }
    )
