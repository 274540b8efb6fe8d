"""What a request may ask of a model, in one table that the API, its documents and the
worker all read: a value the API accepts is one the worker can run.

- The per-model limits are the catalog's (app/catalog.py `ModelSpec`: sizes and their
  multiple, steps, guidance, images, prompt length, the pixel budget); the checks that
  apply them to a request are `model_limit_errors` here, used by the submit schema, the
  estimate endpoint and the OpenAI endpoint.
- A request's defaults (the seed included) are filled in by its job kind
  (app/kinds/base.py `JobKind.normalize`): the job row's `input` is exactly what the
  worker runs.
- `SCHEDULERS` maps each scheduler name a request may give to the diffusers class the
  worker builds (workers/call.py imports it by that name), its options and the model
  families it fits (app/families.py): a flow-matching model (SD3, FLUX) offers only
  flow-matching schedulers, a Stable Diffusion model only the others.
- `OUTPUT_FORMATS`: the encodings the worker writes (workers/encoding.py).

tests/worker/test_rules.py runs every scheduler and every limit's edge on the tiny model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.families import FAMILIES

if TYPE_CHECKING:
    from app.catalog import ModelSpec

MAX_SEED = 2**32 - 1  # image i of a job uses seed + i
OUTPUT_FORMATS = ("png", "jpeg", "webp")


# Every scheduler here was trained over 1,000 timesteps: a run of 1,000 steps or more
# indexes past them (DDIM fails at 1,000), so no model may offer that many.
MAX_STEPS = 999


@dataclass(frozen=True)
class Scheduler:
    class_name: str | None  # in diffusers; None: the pipeline's own scheduler
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # from_config keywords
    note: str = ""
    max_steps: int = MAX_STEPS  # the most steps it can run
    families: tuple[str, ...] = ("sd",)  # the model families it fits (app/families.py)


FLOW = ("sd3", "flux", "ltx")  # the flow-matching families FlowMatchEuler fits

SCHEDULERS: dict[str, Scheduler] = {
    "default": Scheduler(None, note="the model's own", families=tuple(FAMILIES)),
    "ddim": Scheduler("DDIMScheduler"),
    "euler": Scheduler("EulerDiscreteScheduler"),
    "euler_a": Scheduler("EulerAncestralDiscreteScheduler"),
    "dpm++": Scheduler("DPMSolverMultistepScheduler"),
    # PNDM's Runge-Kutta warm-up needs more steps than a job may ask for (it fails below
    # 4); Stable Diffusion's own PNDM configuration skips it.
    "pndm": Scheduler("PNDMScheduler", {"skip_prk_steps": True}),
    "lms": Scheduler("LMSDiscreteScheduler", note="needs scipy (the worker extra)"),
    # LCM samples its steps from `original_inference_steps` (50): more is a ValueError.
    "lcm": Scheduler(
        "LCMScheduler", note="few-step models (LCM, LCM-LoRA): 2 to 8 steps", max_steps=50
    ),
    "flow_euler": Scheduler(
        "FlowMatchEulerDiscreteScheduler",
        note="flow matching (SD3, FLUX, LTX-Video)",
        families=FLOW,
    ),
    # Heun's set_timesteps takes no sigmas: FLUX's resolution-dependent shift passes them.
    "flow_heun": Scheduler(
        "FlowMatchHeunDiscreteScheduler", note="flow matching, SD3 only", families=("sd3",)
    ),
}
SCHEDULER_NAMES = tuple(SCHEDULERS)


def schedulers_for(family: str) -> tuple[str, ...]:
    """The schedulers that fit a model family, in the table's order."""
    return tuple(name for name, s in SCHEDULERS.items() if family in s.families)


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
    if (
        spec.sizes_required
        and "width" not in errors
        and "height" not in errors
        and (width, height) not in spec.size_tiers
    ):
        tiers = ", ".join(spec.sizes)
        for name in ("width", "height"):
            add(name, f"width x height must be one of {tiers} for model '{spec.name}'.")
    steps = data.get("steps")
    if steps is not None and not spec.min_steps <= steps <= spec.max_steps:
        add(
            "steps",
            f"Must be between {spec.min_steps} and {spec.max_steps} for model '{spec.name}'.",
        )
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
        add(
            "scheduler",
            f"Must be one of: {', '.join(spec.schedulers)} (model '{spec.name}' is of "
            f"family '{spec.family}').",
        )
    quality = data.get("quality")
    if quality is not None and quality not in spec.quality:
        add(
            "quality",
            f"Must be one of: {', '.join(spec.quality)} (the tiers model '{spec.name}' offers).",
        )
    chosen = SCHEDULERS.get(scheduler or "default")
    steps = data.get("steps", spec.default_steps)
    if chosen is not None and "steps" not in errors and steps > chosen.max_steps:
        add("steps", f"At most {chosen.max_steps} with scheduler '{scheduler}'.")
    return errors
