"""The submit schema's bounds in the OpenAPI document, from the configured models.

A request's limits depend on its model, but a JSON Schema can state only one bound per
field. The document declares the bounds that every configured model accepts (the
intersection), so a request the document calls valid is valid for any model it names;
each field's description lists the per-model limits.
"""

from __future__ import annotations

import math
from typing import Any

from app.catalog import Catalog, ModelSpec


def _side(models: list[ModelSpec], multiple: int, attr: str) -> int:
    """The largest size every model accepts for one side, with the other at its largest."""
    side = min(getattr(m, attr) for m in models)
    pixels = min(m.max_pixels for m in models)
    other = min(m.max_height if attr == "max_width" else m.max_width for m in models)
    if side * other > pixels:  # both sides at their bound must fit in max_pixels
        side = min(side, math.isqrt(pixels))
    return side // multiple * multiple


def _per_model(models: list[ModelSpec], describe) -> str:
    return "; ".join(f"{m.name}: {describe(m)}" for m in models)


def bounds(catalog: Catalog) -> dict[str, dict[str, Any]]:
    """JSON Schema keywords to add to each property of the submit schema. The shared
    fields' bounds are those every image model accepts (a video model takes only the video
    kinds, with their own rules: `num_frames`, `fps`, one clip a job); the video models are
    named with their limits in those fields' descriptions."""
    every = sorted(catalog.models.values(), key=lambda m: m.name)
    models = [m for m in every if not m.video] or every
    videos = [m for m in every if m.video]
    multiple = math.lcm(*(m.size_multiple for m in models))
    low = -(-max(m.min_size for m in models) // multiple) * multiple
    schedulers = [s for s in models[0].schedulers if all(s in m.schedulers for m in models)]
    prompt_chars = min(m.max_prompt_chars for m in models)
    size = {
        "width": _side(models, multiple, "max_width"),
        "height": _side(models, multiple, "max_height"),
    }
    out: dict[str, dict[str, Any]] = {
        "model": {"enum": [m.name for m in every]},
        "prompt": {"maxLength": prompt_chars},
        "negative_prompt": {"maxLength": prompt_chars},
        "steps": {
            "minimum": max(m.min_steps for m in models),
            "maximum": min(m.max_steps for m in models),
        },
        "guidance_scale": {"minimum": 0, "maximum": min(m.max_guidance for m in models)},
        "num_images": {"minimum": 1, "maximum": min(m.max_num_images for m in models)},
        "scheduler": {"enum": schedulers},
    }
    for field, attr in (("width", "max_width"), ("height", "max_height")):
        out[field] = {
            "minimum": low,
            "maximum": max(low, size[field]),
            "multipleOf": multiple,
            "x-per-model": _per_model(
                models,
                lambda m, attr=attr: (
                    f"multiple of {m.size_multiple}, {m.min_size}..{getattr(m, attr)}, "
                    f"width x height <= {m.max_pixels}"
                    + (f", WIDTHxHEIGHT one of {', '.join(m.sizes)}" if m.sizes_required else "")
                ),
            ),
        }
    if videos:
        out["num_frames"] = {
            "x-per-model": _per_model(
                videos,
                lambda m: (
                    f"k x {m.frame_step} + 1, {m.frame_step + 1}..{m.max_frames} "
                    f"(default {m.default_frames})"
                ),
            )
        }
        out["fps"] = {
            "x-per-model": _per_model(videos, lambda m: f"1..{m.max_fps} (default {m.fps})")
        }
        for field, attr in (("width", "max_width"), ("height", "max_height")):
            out[field]["x-per-model"] += "; " + _per_model(
                videos,
                lambda m, attr=attr: (
                    f"multiple of {m.size_multiple}, {m.min_size}..{getattr(m, attr)}, "
                    f"width x height <= {m.max_pixels} (video)"
                ),
            )
    return out


def declare(spec: Any, catalog: Catalog, component: str = "JobCreate") -> None:
    """Add the bounds to the component, and the per-model limits to its descriptions."""
    schema = spec.components.schemas.get(component)
    if schema is None:
        return
    properties = schema.get("properties", {})
    for field, keywords in bounds(catalog).items():
        prop = properties.get(field)
        if prop is None:
            continue
        per_model = keywords.pop("x-per-model", None)
        prop.update(keywords)
        if per_model:
            prop["description"] = f"{prop.get('description', '')} Per model: {per_model}.".strip()
