"""Cutting a job's sample rows out of a running pipeline call, so the others go on.

A job whose step callback says stop leaves a batched call at that step: its rows are cut
from the latents, the prompt embeddings and the scheduler's per-sample state, and
nothing of it is decoded (workers/call.py).
"""

from __future__ import annotations

from typing import Any

# Tensors the denoising loop carries per sample that the step callback may replace.
ROW_TENSORS = (
    "latents",
    "prompt_embeds",
    "add_text_embeds",
    "add_time_ids",
    "pooled_prompt_embeds",
)


def row_inputs(pipeline: Any) -> list[str] | None:
    """The callback tensors to cut rows from, or None where the loop holds per-sample
    tensors the callback cannot reach (a guidance-embedding UNet: LCM-distilled; a
    transformer whose pooled text embedding it cannot reach: FLUX, SD3's image-to-image;
    a ControlNet's conditioning images)."""
    unet = getattr(pipeline, "unet", None)
    if unet is not None and getattr(unet.config, "time_cond_proj_dim", None) is not None:
        return None
    if getattr(pipeline, "controlnet", None) is not None:
        return None  # the control images' rows live in the loop, out of the callback's reach
    allowed = set(getattr(pipeline, "_callback_tensor_inputs", ()))
    if "latents" not in allowed:
        return None
    if getattr(pipeline, "transformer", None) is not None and (
        "pooled_prompt_embeds" not in allowed
    ):
        return None
    return [name for name in ROW_TENSORS if name in allowed]


def cut_rows(value: Any, keep: list[int], rows: int) -> Any:
    """`value` with only the kept sample rows; classifier-free guidance doubles a tensor
    as [negative; positive], whose halves are cut alike."""
    import torch

    if isinstance(value, list | tuple):
        return type(value)(cut_rows(v, keep, rows) for v in value)
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


def cut_scheduler(scheduler: Any, keep: list[int], rows: int, latent_shape: tuple) -> None:
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
            setattr(scheduler, name, cut_rows(value, keep, rows))
        elif isinstance(value, list) and any(latent_like(v) for v in value):
            setattr(
                scheduler,
                name,
                [cut_rows(v, keep, rows) if latent_like(v) else v for v in value],
            )
