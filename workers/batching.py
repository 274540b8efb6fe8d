"""One pipeline call for several compatible jobs, each with its own seeds, steps and stop.

Jobs batch together when they share the model, size, steps, guidance and scheduler;
prompts, negative prompts, seeds and image counts may differ. Each job's images come from
its own generators (seed, seed + 1, ...), so a job's latents start the same batched or
alone. A job whose `on_step` returns False leaves the batch at that step: its rows are
cut from the latents, the prompt embeddings and the scheduler's per-sample state, so the
others go on without it and nothing of it is decoded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from workers.generation import Generation, Interrupted, _job_pipeline

# What must match for two jobs to share one pipeline call.
BATCH_FIELDS = ("model", "width", "height", "steps", "guidance_scale", "scheduler")


def batch_key(params: dict[str, Any]) -> tuple:
    return tuple(
        float(params.get(f) or 0) if f == "guidance_scale" else params.get(f, "default")
        for f in BATCH_FIELDS
    )


def compatible(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return batch_key(a) == batch_key(b)


# Tensors the denoising loop carries per sample that the step callback may replace.
_ROW_TENSORS = ("latents", "prompt_embeds", "add_text_embeds", "add_time_ids")


def _row_inputs(pipeline: Any) -> list[str] | None:
    """The callback tensors to cut rows from, or None where the loop holds per-sample
    tensors the callback cannot reach (a guidance-embedding UNet: LCM-distilled)."""
    unet = getattr(pipeline, "unet", None)
    if unet is not None and getattr(unet.config, "time_cond_proj_dim", None) is not None:
        return None
    allowed = set(getattr(pipeline, "_callback_tensor_inputs", ()))
    if "latents" not in allowed:
        return None
    return [name for name in _ROW_TENSORS if name in allowed]


def _cut_rows(value: Any, keep: list[int], rows: int, latent_shape: tuple) -> Any:
    """`value` with only the kept sample rows; classifier-free guidance doubles a tensor
    as [negative; positive], whose halves are cut alike."""
    import torch

    if isinstance(value, list | tuple):
        return type(value)(_cut_rows(v, keep, rows, latent_shape) for v in value)
    if not isinstance(value, torch.Tensor) or value.ndim == 0:
        return value
    index = None
    if value.shape[0] == rows:
        index = keep
    elif value.shape[0] == 2 * rows:
        index = keep + [rows + k for k in keep]
    if index is None:
        return value
    return value[torch.tensor(index, device=value.device, dtype=torch.long)]


def _cut_scheduler(scheduler: Any, keep: list[int], rows: int, latent_shape: tuple) -> None:
    """Multistep schedulers (DPM-Solver++, LMS, PNDM, UniPC, Heun) keep earlier samples
    and model outputs per row: cut those too (only latent-shaped tensors are touched)."""
    import torch

    def latent_like(value: Any) -> bool:
        return (
            isinstance(value, torch.Tensor)
            and value.ndim == len(latent_shape)
            and tuple(value.shape[1:]) == tuple(latent_shape[1:])
            and value.shape[0] in (rows, 2 * rows)
        )

    for name, value in list(vars(scheduler).items()):
        if latent_like(value):
            setattr(scheduler, name, _cut_rows(value, keep, rows, latent_shape))
        elif isinstance(value, list) and any(latent_like(v) for v in value):
            setattr(
                scheduler,
                name,
                [_cut_rows(v, keep, rows, latent_shape) if latent_like(v) else v for v in value],
            )


def generate_batch(
    pipeline: Any,
    jobs: Sequence[dict[str, Any]],
    *,
    device: str,
    on_step: Sequence[Callable[[int, int], bool]],
) -> list[Generation | None]:
    """One Generation per job, in order; None for a job that left the batch.

    Raises Interrupted when every job has left (nothing is decoded).
    """
    import torch

    first = jobs[0]
    if any(not compatible(first, job) for job in jobs[1:]):
        raise ValueError("jobs in one batch must share model, size, steps, guidance, scheduler")
    job_pipeline = _job_pipeline(pipeline, first.get("scheduler", "default"))
    prompts: list[str] = []
    negatives: list[str] = []
    generators: list[Any] = []
    owner: list[int] = []  # the job of each sample row, as the rows are now
    for index, params in enumerate(jobs):
        seed = int(params["seed"])
        for i in range(int(params.get("num_images", 1))):
            prompts.append(params["prompt"])
            negatives.append(params.get("negative_prompt") or "")
            generators.append(torch.Generator(device=device).manual_seed(seed + i))
            owner.append(index)
    active = [True] * len(jobs)
    row_inputs = _row_inputs(job_pipeline)
    discarded: set[int] = set()  # left the batch where rows cannot be cut: run, not kept

    def callback(pipe, step_index, _timestep, callback_kwargs):
        total = pipe.num_timesteps
        leaving = []
        for index, still in enumerate(active):
            if still and not on_step[index](step_index + 1, total):
                active[index] = False
                leaving.append(index)
        if not any(active):
            raise Interrupted()  # nobody is left: no further step, no decode
        if not leaving:
            return callback_kwargs
        if row_inputs is None:
            discarded.update(leaving)
            return callback_kwargs
        rows = len(owner)
        keep = [r for r, job in enumerate(owner) if active[job]]
        latents = callback_kwargs["latents"]
        shape = tuple(latents.shape)
        out = {name: _cut_rows(value, keep, rows, shape) for name, value in callback_kwargs.items()}
        _cut_scheduler(pipe.scheduler, keep, rows, shape)
        # The pipeline holds this very list (scheduler.step's generator): cut it in place.
        generators[:] = [generators[r] for r in keep]
        owner[:] = [owner[r] for r in keep]
        return out

    # The negative prompt: one per row where any job has one ("" for the others, as
    # diffusers does for a single job without one); None when none has one.
    negative = negatives if any(negatives) else None
    with torch.inference_mode():
        output = job_pipeline(
            prompt=prompts,
            negative_prompt=negative,
            width=int(first["width"]),
            height=int(first["height"]),
            num_inference_steps=int(first["steps"]),
            guidance_scale=float(first["guidance_scale"]),
            num_images_per_prompt=1,
            generator=generators,
            callback_on_step_end=callback,
            callback_on_step_end_tensor_inputs=row_inputs or ["latents"],
        )
    images = list(output.images)
    flagged = getattr(output, "nsfw_content_detected", None) or [False] * len(images)
    results: list[Generation | None] = []
    for index in range(len(jobs)):
        if not active[index] or index in discarded:
            results.append(None)
            continue
        rows = [r for r, job in enumerate(owner) if job == index]
        results.append(Generation([images[r] for r in rows], [bool(flagged[r]) for r in rows]))
    return results
