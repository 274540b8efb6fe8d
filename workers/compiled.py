"""`torch.compile` per model, by size tier (the catalog's `compile_sizes`).

A compiled denoiser (the UNet, or the transformer of SD3 and FLUX) is fast only for the
shapes it was compiled for: a new size recompiles for tens of seconds on the job that
brought it. So only the sizes the catalog lists run compiled, each compiled and warmed
when the worker starts (workers/pipelines.py `warm_up`); a job of any other size runs on
the same weights eager. The compiled module wraps the eager one (no second copy of the
weights); workers/call.py puts the right one in the pipeline for each call, under the
model's lock, and the eager one back after it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.pipelines import LoadedModel


def denoiser_name(pipeline: Any) -> str | None:
    """The pipeline's denoising module's attribute: `unet` or `transformer`."""
    for name in ("unet", "transformer"):
        if getattr(pipeline, name, None) is not None:
            return name
    return None


def use_compile_cache(folder: Path) -> str:
    """Keep inductor's compiled kernels (its FX graph cache, and Triton's on a GPU) in
    `folder` (DIFFQ_COMPILE_CACHE, under DIFFQ_HOME), so a worker's next start reads them
    instead of compiling again (the tiny UNet on a CPU: 74 s, then 8 s; bench/cold_start.py
    --compile). An operator's own TORCHINDUCTOR_CACHE_DIR wins. Returns the folder used."""
    chosen = os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder))
    Path(chosen).mkdir(parents=True, exist_ok=True)
    return chosen


def compile_denoiser(model: LoadedModel) -> None:
    """Wrap the model's denoiser in torch.compile where the catalog lists sizes for it
    (compiling happens on the first call of each size: the warm-up's)."""
    import torch

    name = denoiser_name(model.pipeline)
    if not model.spec.compile_sizes or name is None:
        return
    if model.spec.lora_limit:  # adapters hot-swapped into fixed slots: no recompile
        from app.addons.lora.worker import PipelineAdapters

        model.pipeline.enable_lora_hotswap(target_rank=model.spec.lora_rank)
        model.adapters = PipelineAdapters(model.spec.lora_limit, fixed=True)
    denoiser = getattr(model.pipeline, name)
    model.compiled = torch.compile(denoiser, backend=model.spec.compile_backend)


def denoiser_for(model: LoadedModel, pipeline: Any, width: int, height: int) -> Any:
    """Put into `pipeline` the denoiser a call of this size runs with; returns the eager
    one, to be put back with `restore`."""
    name = denoiser_name(pipeline)
    if name is None or model.compiled is None:
        return None
    eager = getattr(pipeline, name)
    if (width, height) in model.spec.compile_tiers:
        setattr(pipeline, name, model.compiled)
    return eager


def restore(pipeline: Any, eager: Any) -> None:
    if eager is not None:
        setattr(pipeline, denoiser_name(pipeline), eager)
