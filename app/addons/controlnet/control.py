"""ControlNet conditioning: a job's `controls`, each a ControlNet of the catalog
(`[controlnets.NAME]`) and a control image that steers the layout (edges, depth, pose).

A control names its ControlNet, an image (an upload's id or a `data:` URI in a request;
its digest in the stored job), a `scale` (how strongly it steers), and the part of the
denoising it acts on (`start` .. `end`, fractions of the steps). `preprocess` turns the
image into what the ControlNet was trained on before the call: `none` (the image is the
condition already: an edge map, a depth map) or `canny` (OpenCV's Canny edges of it,
computed by the worker, as the reference canny ControlNets were trained).

A ControlNet fits a model when both are of one add-on family (app/families.py
ADDON_FAMILIES: sd15, sd2, sdxl, tiny for Stable Diffusion; flux, tiny-flux for FLUX),
the `lora_family` a model declares: the family says the widths of the layers add-on
weights attach to. So an SDXL ControlNet for an SD 1.5 model, or an SD one for a FLUX
model, is a 422 naming the control, never a worker's crash.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A control's scale: 0 (no effect) .. SCALE_LIMIT (diffusers' own examples stay under 2).
SCALE_LIMIT = 2.0
PREPROCESSORS = ("none", "canny")
# OpenCV Canny's hysteresis thresholds, as the reference canny ControlNets used.
CANNY_LOW, CANNY_HIGH = 100, 200


@dataclass(frozen=True)
class ControlNetSpec:
    """A ControlNet of the catalog (`[controlnets.NAME]`): a diffusers ControlNetModel
    (FluxControlNetModel for FLUX) directory, read by the workers that serve a model of
    its `family`."""

    name: str
    path: Path
    family: str


@dataclass(frozen=True, slots=True)
class Control:
    """One control of a job: its ControlNet, the image's digest (app/uploads.py), and
    how it steers."""

    controlnet: str
    image: str
    scale: float = 1.0
    start: float = 0.0
    end: float = 1.0
    preprocess: str = "none"

    def stored(self) -> dict[str, Any]:
        return {
            "controlnet": self.controlnet,
            "image": self.image,
            "scale": self.scale,
            "start": self.start,
            "end": self.end,
            "preprocess": self.preprocess,
        }

    @classmethod
    def of(cls, value: Any) -> Control:
        if isinstance(value, Control):
            return value
        return cls(
            str(value["controlnet"]),
            str(value["image"]),
            float(value.get("scale", 1.0)),
            float(value.get("start", 0.0)),
            float(value.get("end", 1.0)),
            str(value.get("preprocess", "none")),
        )


def input_field(index: int) -> str:
    """The input-image field of control `index` (what the worker loads it under)."""
    return f"controls.{index}.image"


def refusals(
    controlnets: Mapping[str, ControlNetSpec], model: str, family: str, item: Mapping[str, Any]
) -> dict[str, list[str]]:
    """What is wrong with one requested control for a model of add-on `family`, by its
    field (the field's own ranges are the schema's)."""
    errors: dict[str, list[str]] = {}
    chosen = controlnets.get(item["controlnet"])
    if chosen is None:
        offered = sorted(n for n, c in controlnets.items() if c.family == family)
        errors["controlnet"] = [
            "No such ControlNet in the catalog. For model "
            f"'{model}': {', '.join(offered) or 'none'}."
        ]
    elif chosen.family != family:
        errors["controlnet"] = [
            f"ControlNet '{chosen.name}' is for {chosen.family} models; "
            f"model '{model}' takes {family} add-ons."
        ]
    if item.get("start", 0.0) >= item.get("end", 1.0):
        errors["end"] = ["Must be greater than start."]
    return errors


def preprocessed(image: Any, preprocess: str, width: int, height: int) -> Any:
    """The control image as its ControlNet reads it: RGB at the output's size, with the
    preprocessing applied (PIL in, PIL out)."""
    from PIL import Image

    image = image.convert("RGB")
    if image.size != (width, height):
        image = image.resize((width, height), resample=Image.Resampling.LANCZOS)
    if preprocess == "canny":
        import cv2
        import numpy as np

        edges = cv2.Canny(np.asarray(image.convert("L")), CANNY_LOW, CANNY_HIGH)
        image = Image.fromarray(edges).convert("RGB")
    return image


def control_images(job: Any, inputs: Mapping[str, Any], box: Any = None) -> list[Any]:
    """Each of the job's control images (PIL, by its input field in `inputs`) at the
    output's size, cropped to `box` where an inpainting redraws its masked region alone,
    preprocessed as its control asks."""
    width, height = job.width, job.height
    images = []
    for index, control in enumerate(job.controls):
        image = inputs[input_field(index)].convert("RGB")
        if box is not None:
            image = image.resize((width, height)).crop(box)
        images.append(preprocessed(image, control.preprocess, width, height))
    return images


def control_keywords(
    controls: Sequence[Control], images: Sequence[Any], keyword: str
) -> dict[str, Any]:
    """The ControlNet keywords of a call (one image per control, which diffusers repeats
    for every row), the images under the kind's `keyword`."""
    images = list(images)
    if len(controls) == 1:
        control = controls[0]
        return {
            keyword: images[0],
            "controlnet_conditioning_scale": control.scale,
            "control_guidance_start": control.start,
            "control_guidance_end": control.end,
        }
    return {
        keyword: images,
        "controlnet_conditioning_scale": [c.scale for c in controls],
        "control_guidance_start": [c.start for c in controls],
        "control_guidance_end": [c.end for c in controls],
        "control_mode": [None] * len(controls),  # FLUX's pipelines (workers/call.py)
    }
