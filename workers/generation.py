"""Run one job through a shared pipeline with its own scheduler and seeded generators."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

SCHEDULER_CLASSES = {
    "ddim": "DDIMScheduler",
    "euler": "EulerDiscreteScheduler",
    "euler_a": "EulerAncestralDiscreteScheduler",
    "dpm++": "DPMSolverMultistepScheduler",
    "pndm": "PNDMScheduler",
}


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
    if scheduler_name == "default":
        return type(pipeline.scheduler).from_config(config)
    return getattr(diffusers, SCHEDULER_CLASSES[scheduler_name]).from_config(config)


def generate_images(
    pipeline: Any,
    params: dict[str, Any],
    *,
    device: str,
    on_step: Callable[[int, int], bool],
) -> list[Any]:
    """PIL images for `params`; image i uses seed `params['seed'] + i`.

    `on_step(step, total)` is called after every denoising step; returning False stops
    the run at that step and raises Interrupted.
    """
    import torch

    job_pipeline = _job_pipeline(pipeline, params.get("scheduler", "default"))
    count = int(params.get("num_images", 1))
    seed = int(params["seed"])
    generators = [torch.Generator(device=device).manual_seed(seed + i) for i in range(count)]
    stopped = False

    def callback(pipe, step_index, _timestep, callback_kwargs):
        nonlocal stopped
        if not on_step(step_index + 1, pipe.num_timesteps):
            stopped = True
            pipe._interrupt = True
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
    if stopped:
        raise Interrupted()
    return list(output.images)
