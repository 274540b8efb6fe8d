"""What every job kind shares: the typed request (`JobRequest`) and the kind's contract
(`JobKind`). A kind is one module of this package (app/kinds/txt2img.py is the first);
app/kinds/__init__.py lists them.

A job's request is built once: from the validated body (`JobKind.normalize`) or from the
stored row (`request_from_stored`), and read by attribute everywhere after. The row keeps
`JobRequest.stored()`, a plain JSON object with the kind's name in it.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from app.addons import ADDONS
from app.addons.controlnet import CONTROLNET, Control
from app.addons.lora import LORA, Lora
from app.quality import DEFAULT_TIER
from app.rules import MAX_SEED

if TYPE_CHECKING:
    import marshmallow as ma

    from app.catalog import ModelSpec

# One unit of work in the estimate: one denoising step of one 512 x 512 image (with a VAE
# that downsamples by 8, as every Stable Diffusion VAE does, the work grows with pixels).
REFERENCE_PIXELS = 512 * 512


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRequest:
    """A job's normalized request: every default filled in, the seed included, so that
    the worker runs exactly what the row says. Fields every kind has; a kind's own
    fields are declared by its subclass."""

    kind: str
    model: str
    prompt: str
    negative_prompt: str | None = None
    width: int
    height: int
    steps: int
    guidance_scale: float
    seed: int
    num_images: int = 1
    scheduler: str = "default"
    output_format: str = "png"
    priority: str = "normal"
    # Add-on weights (app/addons: ADDONS, by field), each in the order given.
    # LoRA adapters: each one's digest and scale (every kind takes them).
    loras: tuple[Lora, ...] = ()
    # ControlNet conditioning: the image kinds take it.
    controls: tuple[Control, ...] = ()
    # The quality tier it runs at (app/quality.py): `exact`, `balanced` or `fast`.
    quality: str = DEFAULT_TIER

    # Inputs that do not change the images (left out of the cache key).
    NOT_IN_CACHE_KEY: ClassVar[tuple[str, ...]] = ("priority",)

    def __post_init__(self) -> None:
        for name, addon in ADDONS.items():
            object.__setattr__(self, name, addon.of(getattr(self, name)))

    def stored(self) -> dict[str, Any]:
        """The row's `input`: plain JSON, the kind's name included. Add-ons only where
        there are some, so a job without them stores (and keys the cache) as before;
        `quality` likewise only where it is not `exact`."""
        stored = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, addon in ADDONS.items():
            if stored[name]:
                stored[name] = addon.stored(stored[name])
            else:
                del stored[name]
        if stored["quality"] == DEFAULT_TIER:
            del stored["quality"]
        return stored

    @property
    def adapter_set(self) -> str:
        """SHA-256 of the adapters' digests and scales ("" for none): jobs of one set may
        share a pipeline call, and a worker holding the set warm prefers its jobs."""
        return LORA.set_key(self.loras)

    @property
    def control_set(self) -> str:
        """SHA-256 of the controls ("" for none): jobs of one set may share a call."""
        return CONTROLNET.set_key(self.controls)

    def cache_fields(self) -> dict[str, Any]:
        return {k: v for k, v in self.stored().items() if k not in self.NOT_IN_CACHE_KEY}

    @property
    def denoise_steps(self) -> int:
        """The denoising steps that really run (what progress counts to)."""
        return self.steps

    @property
    def pixels(self) -> int:
        """What the job asks of the GPU's memory: width x height x images."""
        return self.width * self.height * self.num_images

    @property
    def work_units(self) -> int:
        """Steps x images: what the queue's ETA charges."""
        return max(1, self.denoise_steps) * max(1, self.num_images)

    @property
    def work(self) -> float:
        """Units of the estimate: steps x images x (pixels / 512^2)."""
        adapters = 1 + sum(a.work * len(getattr(self, n)) for n, a in ADDONS.items())
        return self.work_units * self.width * self.height / REFERENCE_PIXELS * adapters

    def image_seed(self, index: int) -> int:
        """Image i of a job uses seed + i."""
        return self.seed + index


class JobKind:
    """A kind of job: its request type, its API fields and limits, how it normalizes, what
    may share a pipeline call, which diffusers pipeline it runs on and with what."""

    name: ClassVar[str]
    request_type: ClassVar[type[JobRequest]]
    summary: ClassVar[str]
    # The diffusers AutoPipeline whose `from_pipe` gives this kind's pipeline from a
    # loaded model, sharing its weights (workers/call.py).
    pipeline: ClassVar[str]
    # Request fields that name an input image: in a body, an upload's id or a `data:`
    # URI; in the stored request, the image's digest (app/uploads.py). `mask_fields` are
    # those of them read as masks (L: white = repaint).
    image_fields: ClassVar[tuple[str, ...]] = ()
    mask_fields: ClassVar[tuple[str, ...]] = ()
    # A video kind (app/kinds/video.py): a job makes one clip, on a video model alone.
    video: ClassVar[bool] = False
    # Input fields that must be equal for two jobs to share one pipeline call.
    batch_fields: ClassVar[tuple[str, ...]] = (
        "kind",
        "model",
        "width",
        "height",
        "steps",
        "guidance_scale",
        "scheduler",
        *(addon.batch_field for addon in ADDONS.values()),
        "quality",
    )
    # The keyword the kind's ControlNet pipeline takes its control images by (the
    # image-to-image pipelines take the input image as `image`).
    control_keyword: ClassVar[str] = "image"

    def pipeline_for(self, family: str) -> str:
        """The diffusers class (an AutoPipeline for the image families) that runs this kind
        on a model of `family` (app/families.py `pipelines`)."""
        from app.families import FAMILIES

        chosen = FAMILIES[family].pipeline_for(self.name) if family in FAMILIES else None
        return chosen or self.pipeline

    def outputs(self, output: Any) -> list[Any]:
        """What the pipeline made, one entry per row (an image; a clip's frames)."""
        return list(output.images)

    def api_fields(self) -> dict[str, ma.fields.Field]:
        """The request fields only this kind takes (POST /v1/jobs), beyond the shared ones."""
        return {}

    def limit_errors(self, spec: ModelSpec, data: Mapping[str, Any]) -> dict[str, list[str]]:
        """This kind's own limits that the request breaks, by field (the shared limits
        are app/rules.py's)."""
        return {}

    def own_fields(self, spec: ModelSpec, data: Mapping[str, Any]) -> dict[str, Any]:
        """This kind's own request fields, normalized (defaults filled in)."""
        return {}

    def default_size(self, spec: ModelSpec, data: Mapping[str, Any]) -> tuple[int, int]:
        """The output's width and height when the request names none: its input image's
        (image to image, inpainting, image to video), fitted to the model's limits, else
        the model's default."""
        from app.kinds.images import InputRef, fit_size

        image = data.get("image")
        if isinstance(image, InputRef):
            return fit_size(spec, image.width, image.height)
        return spec.default_width, spec.default_height

    def normalize(self, spec: ModelSpec, data: Mapping[str, Any]) -> JobRequest:
        """The validated request with every default filled in, the seed included. An
        input image field holds an `app.kinds.images.InputRef` here; the request keeps its
        digest."""
        seed = data.get("seed")
        width, height = self.default_size(spec, data)
        return self.request_type(
            kind=self.name,
            model=spec.name,
            prompt=data["prompt"],
            negative_prompt=data.get("negative_prompt"),
            width=data.get("width", width),
            height=data.get("height", height),
            steps=data.get("steps", spec.default_steps),
            guidance_scale=float(data.get("guidance_scale", spec.default_guidance)),
            seed=seed if seed is not None else secrets.randbelow(MAX_SEED + 1),
            num_images=data.get("num_images", 1),
            scheduler=data.get("scheduler", "default"),
            output_format=data.get("output_format", "png"),
            priority=data.get("priority", "normal"),
            **{name: tuple(data.get(name) or ()) for name in ADDONS},
            quality=data.get("quality") or spec.default_quality,
            **self.own_fields(spec, data),
        )

    def batch_key(self, job: JobRequest) -> tuple:
        return tuple(getattr(job, name) for name in self.batch_fields)

    def inputs(self, job: JobRequest) -> dict[str, str]:
        """The digests of the input images the job runs on, by field (its add-ons' too:
        its controls' under `controls.N.image`)."""
        found = {name: getattr(job, name) for name in self.image_fields if getattr(job, name)}
        for name, addon in ADDONS.items():
            found.update(addon.inputs(getattr(job, name)))
        return found

    def prepare(self, job: JobRequest, inputs: Mapping[str, Any]) -> Mapping[str, Any]:
        """What a job's pipeline rows need of its input images (PIL, by field), made once
        per call: `call_arguments` and `finish` get it."""
        return inputs

    def prepared(self, job: JobRequest, inputs: Mapping[str, Any]) -> Mapping[str, Any]:
        """`prepare`'s, with what each add-on makes of the job's input images (app/addons
        `Addon.prepare`: the control images, each at the output's size, cropped as the
        input is where an inpainting redraws its masked region alone, preprocessed)."""
        made = self.prepare(job, inputs)
        own = {}
        for addon in ADDONS.values():
            own.update(addon.prepare(job, inputs, made))
        return {**made, **own} if own else made

    def finish(self, job: JobRequest, images: list[Any], inputs: Mapping[str, Any]) -> list[Any]:
        """The job's images as delivered, from what the pipeline made (an inpainting puts
        the pixels outside its mask back)."""
        return images

    def warm_up(self, spec: ModelSpec) -> tuple[JobRequest, dict[str, Any]]:
        """A one-step job of this kind and its inputs, to warm a model up with."""
        data = {"prompt": "warm-up", "width": spec.min_size, "height": spec.min_size}
        return self.normalize(spec, {**data, "steps": 1, "seed": 0}), {}

    def call_arguments(
        self, jobs: Sequence[JobRequest], inputs: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, Any]:
        """The pipeline call's keywords for these compatible jobs, one sample row per
        image (job by job, in order); `inputs`: each job's input images (PIL, by field).
        The caller adds the generators, the scheduler and the step callback."""
        first = jobs[0]
        shape = {
            "width": first.width,
            "height": first.height,
            "num_inference_steps": first.steps,
            "guidance_scale": first.guidance_scale,
            **self.addon_arguments(first, inputs[0] if inputs else {}),
        }
        if len(jobs) == 1:  # the prompt encoded once, its rows repeated by diffusers
            return {
                **shape,
                "prompt": first.prompt,
                "negative_prompt": first.negative_prompt or None,
                "num_images_per_prompt": first.num_images,
            }
        prompts = [job.prompt for job in jobs for _ in range(job.num_images)]
        negatives = [job.negative_prompt or "" for job in jobs for _ in range(job.num_images)]
        return {
            **shape,
            "prompt": prompts,
            # One per row where any job has one ("" for the others, as diffusers does for
            # a single job without one); None when none has one.
            "negative_prompt": negatives if any(negatives) else None,
            "num_images_per_prompt": 1,
        }

    def addon_arguments(self, job: JobRequest, prepared: Mapping[str, Any]) -> dict[str, Any]:
        """The add-ons' keywords of a call whose jobs share `job`'s add-ons (app/addons
        `Addon.call_keywords`: the ControlNets' images, one per control, which diffusers
        repeats for every row, and their scales and spans); none without."""
        found: dict[str, Any] = {}
        for addon in ADDONS.values():
            found.update(addon.call_keywords(self, job, prepared))
        return found
