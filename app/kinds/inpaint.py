"""Inpainting: the masked part of an input image redrawn from the prompt, the rest left as
it was. The `mask` is an image of the input's size: white (light) repaints, black keeps.
Its edge is softened by `mask_blur` pixels, and every pixel the softened mask leaves
untouched is the input's own in the result (pasted back, as AUTOMATIC1111 does), so
nothing outside the mask drifts. With `masked_only` (A1111's "inpaint only masked"), only
the mask's region (its bounding box, `masked_padding` pixels wider, grown to the output's
shape) is redrawn, at the output's full resolution, and pasted back into the input.

Runs on the model's own weights with diffusers' inpainting pipeline: a model with a
dedicated inpainting UNet (9 input channels) offers only this kind (`kinds` in the
catalog)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.kinds.base import JobKind, JobRequest
from app.kinds.images import InputRef, as_mask, blurred, image_field, masked_box, resized
from app.kinds.img2img import ImageKind, denoise_steps

if TYPE_CHECKING:
    from app.catalog import ModelSpec

MAX_MASK_BLUR = 64
MAX_MASKED_PADDING = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class InpaintRequest(JobRequest):
    kind: str = "inpaint"
    image: str  # the input's SHA-256 (app/uploads.py)
    mask: str  # the mask's
    strength: float = 1.0
    mask_blur: int = 4
    masked_only: bool = False
    masked_padding: int = 32

    @property
    def denoise_steps(self) -> int:
        return denoise_steps(self.steps, self.strength)


class Inpaint(ImageKind):
    name = "inpaint"
    request_type = InpaintRequest
    summary = (
        "Inpainting: where `mask` is white, `image` redrawn from the prompt; the rest is "
        "the input's own pixels."
    )
    pipeline = "AutoPipelineForInpainting"
    image_fields = ("image", "mask")
    mask_fields = ("mask",)
    default_strength = 1.0

    def api_fields(self) -> dict[str, Any]:
        import marshmallow as ma
        from marshmallow import validate

        return {
            **super().api_fields(),
            "mask": image_field(
                "inpaint", "What to redraw: white repaints, black keeps; the image's size."
            ),
            "mask_blur": ma.fields.Integer(
                strict=True,
                load_default=None,
                validate=validate.Range(min=0, max=MAX_MASK_BLUR),
                metadata={
                    "description": f"Pixels that soften the mask's edge, 0..{MAX_MASK_BLUR} "
                    "(default 4). Kinds: inpaint."
                },
            ),
            "masked_only": ma.fields.Boolean(
                load_default=None,
                metadata={
                    "description": "Redraw only the mask's region, at the output's full "
                    "resolution, and paste it back (default false). Kinds: inpaint."
                },
            ),
            "masked_padding": ma.fields.Integer(
                strict=True,
                load_default=None,
                validate=validate.Range(min=0, max=MAX_MASKED_PADDING),
                metadata={
                    "description": "With `masked_only`: pixels of context around the mask, "
                    f"0..{MAX_MASKED_PADDING} (default 32). Kinds: inpaint."
                },
            ),
        }

    def limit_errors(self, spec: ModelSpec, data: Mapping[str, Any]) -> dict[str, list[str]]:
        errors = super().limit_errors(spec, data)
        image, mask = data.get("image"), data.get("mask")
        both = isinstance(image, InputRef) and isinstance(mask, InputRef)
        if both and (mask.width, mask.height) != (image.width, image.height):
            errors.setdefault("mask", []).append(
                f"Must be the image's size, {image.width}x{image.height} "
                f"(it is {mask.width}x{mask.height})."
            )
        return errors

    def own_fields(self, spec: ModelSpec, data: Mapping[str, Any]) -> dict[str, Any]:
        defaults = InpaintRequest.__dataclass_fields__

        def given(name: str) -> Any:
            value = data.get(name)
            return defaults[name].default if value is None else value

        return {
            **super().own_fields(spec, data),
            "mask": data["mask"].sha256,
            "mask_blur": given("mask_blur"),
            "masked_only": given("masked_only"),
            "masked_padding": given("masked_padding"),
        }

    def prepare(self, job: JobRequest, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The input and the mask at the output's size, the softened mask the result is
        pasted back through, and (masked only) the region the pipeline redraws."""
        width, height = job.width, job.height
        base = resized(inputs["image"].convert("RGB"), width, height)
        mask = resized(as_mask(inputs["mask"]), width, height)
        soft = blurred(mask, job.mask_blur)
        box = None
        image, image_mask = base, soft
        if job.masked_only:
            box = masked_box(mask, job.masked_padding, width, height)
            image = resized(base.crop(box), width, height)
            image_mask = resized(soft.crop(box), width, height)
        return {"image": image, "mask": image_mask, "base": base, "soft": soft, "box": box}

    def call_arguments(
        self, jobs: Sequence[JobRequest], inputs: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, Any]:
        arguments = JobKind.call_arguments(self, jobs, inputs)  # width and height stay
        arguments["strength"] = jobs[0].strength
        if len(jobs) == 1:
            arguments["image"], arguments["mask_image"] = inputs[0]["image"], inputs[0]["mask"]
            return arguments
        rows = [
            prepared
            for job, prepared in zip(jobs, inputs, strict=True)
            for _ in range(job.num_images)
        ]
        arguments["image"] = [prepared["image"] for prepared in rows]
        arguments["mask_image"] = [prepared["mask"] for prepared in rows]
        return arguments

    def finish(self, job: JobRequest, images: list[Any], inputs: Mapping[str, Any]) -> list[Any]:
        """Every pixel outside the softened mask is the input's own."""
        from PIL import Image

        base, soft, box = inputs["base"], inputs["soft"], inputs["box"]
        finished = []
        for made in images:
            if box is None:
                finished.append(Image.composite(made.convert("RGB"), base, soft))
                continue
            region = resized(made.convert("RGB"), box[2] - box[0], box[3] - box[1])
            result = base.copy()
            result.paste(region, box[:2], soft.crop(box))
            finished.append(result)
        return finished

    def warm_up(self, spec: ModelSpec) -> tuple[JobRequest, dict[str, Any]]:
        from PIL import Image

        request, inputs = super().warm_up(spec)
        side = spec.min_size
        inputs["mask"] = Image.new("L", (side, side), 255)
        return request, inputs


KIND = Inpaint()
