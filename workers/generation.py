"""Run one job through a shared pipeline with its own scheduler and seeded generators."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.rules import SCHEDULERS


class Interrupted(Exception):
    """The step callback asked the run to stop (lease lost or job canceled)."""


def _job_pipeline(pipeline: Any, scheduler_name: str) -> Any:
    """A shallow copy sharing the weights, with a scheduler of its own.

    Schedulers hold per-run state (timesteps, step index), so two jobs must never share
    one; the copy also keeps `_interrupt` and callbacks per job.
    """
    job_pipeline = copy.copy(pipeline)
    job_pipeline.scheduler = job_scheduler(pipeline, scheduler_name)
    return job_pipeline


def job_scheduler(pipeline: Any, scheduler_name: str) -> Any:
    """A new scheduler of the requested kind, configured from the pipeline's."""
    import diffusers

    config = pipeline.scheduler.config
    scheduler = SCHEDULERS[scheduler_name]  # app/rules.py: the names a request may give
    if scheduler.class_name is None:
        return type(pipeline.scheduler).from_config(config)
    return getattr(diffusers, scheduler.class_name).from_config(config, **scheduler.options)


@dataclass(frozen=True)
class Generation:
    images: list[Any]
    # Per image: True where the model's safety checker blacked it out.
    nsfw: list[bool]


def generate_images(
    pipeline: Any,
    params: dict[str, Any],
    *,
    device: str,
    on_step: Callable[[int, int], bool],
) -> list[Any]:
    """The images alone (see `generate`)."""
    return generate(pipeline, params, device=device, on_step=on_step).images


def generate(
    pipeline: Any,
    params: dict[str, Any],
    *,
    device: str,
    on_step: Callable[[int, int], bool],
) -> Generation:
    """PIL images for `params`; image i uses seed `params['seed'] + i`.

    `on_step(step, total)` is called after every denoising step; returning False stops
    the run right there and raises Interrupted (nothing of the run is decoded).
    """
    import torch

    job_pipeline = _job_pipeline(pipeline, params.get("scheduler", "default"))
    count = int(params.get("num_images", 1))
    seed = int(params["seed"])
    generators = [torch.Generator(device=device).manual_seed(seed + i) for i in range(count)]

    def callback(pipe, step_index, _timestep, callback_kwargs):
        if not on_step(step_index + 1, pipe.num_timesteps):
            # Raising (not diffusers' `_interrupt`, which only `continue`s) leaves at once:
            # no remaining step loop, no VAE decode, no safety checker.
            raise Interrupted()
        return callback_kwargs

    with torch.inference_mode():
        output = job_pipeline(
            prompt=params["prompt"],
            negative_prompt=params.get("negative_prompt") or None,
            width=int(params["width"]),
            height=int(params["height"]),
            num_inference_steps=int(params["steps"]),
            guidance_scale=float(params["guidance_scale"]),
            num_images_per_prompt=count,
            generator=generators if count > 1 else generators[0],
            callback_on_step_end=callback,
        )
    images = list(output.images)
    flagged = getattr(output, "nsfw_content_detected", None) or [False] * len(images)
    return Generation(images, [bool(flag) for flag in flagged])
