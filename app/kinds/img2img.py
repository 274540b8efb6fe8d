"""Image to image: an input image redrawn from the prompt. `strength` (0..1) says how much
changes: the input is noised to that point and `int(steps x strength)` denoising steps run
(what progress counts to). The output's size is the input's unless the request names one
(the input is resized to it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.kinds.base import JobKind, JobRequest
from app.kinds.images import InputRef, image_field, resized, strength_field

if TYPE_CHECKING:
    from app.catalog import ModelSpec

DEFAULT_STRENGTH = 0.75


def denoise_steps(steps: int, strength: float) -> int:
    """The steps a strength leaves (diffusers' `get_timesteps`)."""
    return min(int(steps * strength), steps)


@dataclass(frozen=True, slots=True, kw_only=True)
class Img2ImgRequest(JobRequest):
    kind: str = "img2img"
    image: str  # the input's SHA-256 (app/uploads.py)
    strength: float = DEFAULT_STRENGTH

    @property
    def denoise_steps(self) -> int:
        return denoise_steps(self.steps, self.strength)


class ImageKind(JobKind):
    """A kind that starts from an input image (img2img, inpaint)."""

    image_fields = ("image",)
    batch_fields = (*JobKind.batch_fields, "strength")
    default_strength = DEFAULT_STRENGTH
    control_keyword = "control_image"  # `image` is the input to redraw

    def api_fields(self) -> dict[str, Any]:
        return {
            "image": image_field("img2img, inpaint, img2vid", "The input image."),
            "strength": strength_field(),
        }

    def limit_errors(self, spec: ModelSpec, data: Mapping[str, Any]) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {}
        for name in self.image_fields:
            if data.get(name) is None:
                errors[name] = [f"Required for kind '{self.name}'."]
        # Checked with the values the worker will use: a field left out counts at its
        # default (steps x the default strength 0.75 leaves no step at steps=1).
        given = data.get("strength")
        strength = self.default_strength if given is None else given
        steps = data.get("steps", spec.default_steps)
        if denoise_steps(steps, strength) < 1:
            field = "steps" if given is None and "steps" in data else "strength"
            said = {"steps": "" if "steps" in data else " (the model's default)"}
            said["strength"] = " (the default)" if given is None else ""
            least = next(
                (n for n in range(1, spec.max_steps + 1) if denoise_steps(n, strength)), None
            )
            fix = (
                f"ask for at least {least} steps, or a strength of at least {1 / steps:.2f}"
                if least is not None  # a strength of 0 leaves none at any step count
                else f"ask for a strength of at least {1 / spec.max_steps:.3f} (at "
                f"{spec.max_steps} steps, the model's most) or {1 / steps:.2f} at {steps}"
            )
            errors.setdefault(field, []).append(
                f"strength x steps = {strength}{said['strength']} x {steps}{said['steps']} "
                f"leaves no step to run: {fix}."
            )
        return errors

    def own_fields(self, spec: ModelSpec, data: Mapping[str, Any]) -> dict[str, Any]:
        strength = data.get("strength")
        return {
            "image": data["image"].sha256,
            "strength": float(self.default_strength if strength is None else strength),
        }

    def prepare(self, job: JobRequest, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The input at the output's size."""
        return {"image": resized(inputs["image"].convert("RGB"), job.width, job.height)}

    def call_arguments(
        self, jobs: Sequence[JobRequest], inputs: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, Any]:
        arguments = super().call_arguments(jobs, inputs)
        del arguments["width"], arguments["height"]  # the image's size is the output's
        arguments["strength"] = jobs[0].strength
        if len(jobs) == 1:
            arguments["image"] = inputs[0]["image"]
        else:
            arguments["image"] = [
                prepared["image"]
                for job, prepared in zip(jobs, inputs, strict=True)
                for _ in range(job.num_images)
            ]
        return arguments

    def warm_up(self, spec: ModelSpec) -> tuple[JobRequest, dict[str, Any]]:
        from PIL import Image

        side = spec.min_size
        gray = Image.new("RGB", (side, side), (128, 128, 128))
        data = {"prompt": "warm-up", "steps": 1, "seed": 0, "strength": 1.0}
        refs = {name: InputRef("warm-up", side, side, "RGB") for name in self.image_fields}
        request = self.normalize(spec, {**data, **refs})
        return request, {name: gray for name in self.image_fields}


class Img2Img(ImageKind):
    name = "img2img"
    request_type = Img2ImgRequest
    summary = "Image to image: the input `image` redrawn from the prompt, `strength` 0..1."
    pipeline = "AutoPipelineForImage2Image"


KIND = Img2Img()
