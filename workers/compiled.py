"""`torch.compile` per model, by size tier (the catalog's `compile_sizes`), of the whole
denoiser or of its repeated blocks (`compile_scope`).

A compiled denoiser (the UNet, or the transformer of SD3, FLUX, Wan, LTX-Video) is fast
only for the shapes it was compiled for: a new size recompiles for tens of seconds on the
job that brought it. So only the sizes the catalog lists run compiled, each compiled and
warmed when the worker starts (workers/pipelines.py `warm_up`); a job of any other size
runs eager, and so does a call whose tier puts a step cache's hooks on the denoiser.

The denoiser is compiled in place (its `forward`, or each repeated block by diffusers'
`compile_repeated_blocks`): one module, the same weights, the same names for LoRA's
layers, whichever way a call runs. A call that must run eager runs under the
compiler's `force_eager` stance (`running`): the compiled code is kept, not used, and
nothing is traced. One mechanism serves both scopes.

Regional compilation (`blocks`) compiles one block's code once and reuses it for every
block of that class: a FLUX transformer's 57 blocks are two graphs instead of one graph
of the whole model, compiled in a fraction of the time (docs/performance.md), at nearly
the same speed where the blocks hold the work (a transformer). A UNet's convolutions lie
outside its transformer blocks, so `auto` compiles a UNet whole.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.catalog import ModelSpec
    from app.kinds import JobRequest
    from workers.pipelines import LoadedModel


class CompileRefused(RuntimeError):
    """The catalog's compile_scope cannot be applied to this denoiser."""


def denoiser_name(pipeline: Any) -> str | None:
    """The pipeline's denoising module's attribute: `unet` or `transformer`."""
    for name in ("unet", "transformer"):
        if getattr(pipeline, name, None) is not None:
            return name
    return None


def use_compile_cache(folder: Path) -> str:
    """Keep inductor's compiled kernels (its FX graph cache, and Triton's on a GPU) in
    `folder` (DIFFQ_COMPILE_CACHE, under DIFFQ_HOME), so a worker's next start reads them
    instead of compiling again (the tiny UNet whole on a CPU: 108 s, then 11 s;
    bench/cold_start.py --compile). An operator's own TORCHINDUCTOR_CACHE_DIR wins.
    Returns the folder used."""
    chosen = os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder))
    Path(chosen).mkdir(parents=True, exist_ok=True)
    return chosen


def resolved_scope(scope: str, pipeline: Any) -> str:
    """`model` or `blocks` for this pipeline's denoiser: `auto` is `blocks` for a
    transformer that names its repeated blocks, else `model`."""
    if scope != "auto":
        return scope
    name = denoiser_name(pipeline)
    repeated = getattr(getattr(pipeline, name or "", None), "_repeated_blocks", None)
    return "blocks" if name == "transformer" and repeated else "model"


def compile_denoiser(model: LoadedModel) -> None:
    """Compile the model's denoiser in place where the catalog lists sizes for it
    (compiling happens on the first call of each size: the warm-up's). Sets
    `model.compiled` to the scope applied: `model` or `blocks`."""
    import torch

    name = denoiser_name(model.pipeline)
    if not model.spec.compile_sizes or name is None:
        return
    denoiser = getattr(model.pipeline, name)
    scope = resolved_scope(model.spec.compile_scope, model.pipeline)
    if model.spec.lora_limit:  # adapters hot-swapped into fixed slots: no recompile
        from app.addons.lora.worker import PipelineAdapters

        model.pipeline.enable_lora_hotswap(target_rank=model.spec.lora_rank)
        model.adapters = PipelineAdapters(model.spec.lora_limit, fixed=True)
    backend = model.spec.compile_backend
    if scope == "blocks":
        try:
            denoiser.compile_repeated_blocks(backend=backend)
        except (AttributeError, ValueError) as exc:  # none named, or none found
            raise CompileRefused(
                f"{type(denoiser).__name__} has no repeated blocks to compile ({exc}); "
                'compile_scope "model" compiles it whole'
            ) from exc
    else:  # its forward, not the module's __call__: peft's hot-swap refuses a module
        # compiled in place (`_compiled_call_impl`) before its first adapter
        denoiser.forward = torch.compile(denoiser.forward, backend=backend)
    model.compiled = scope


def compile_shapes(spec: ModelSpec, request: JobRequest) -> list[JobRequest]:
    """The warm-up's calls at one compile tier, one per graph a job of that size can
    need, so that none compiles on a job: dynamo compiles a graph per batch of rows it
    has not seen, where a call's rows are its images, twice over where guidance is on.
    One row is a graph of its own (dynamo specializes a dimension of 1: an unguided
    image, or any after a tier's guidance cut); two rows a second; a call with more
    rows makes the batch dynamic, one graph up to the most rows a call can carry (a
    whole batch of jobs of the most images each, within max_pixels_per_job; a video job
    is one clip, alone), which the last call runs."""
    from dataclasses import replace

    per_job = spec.max_num_images
    if spec.max_pixels_per_job is not None:  # what one job may ask of the GPU's memory
        per_job = min(per_job, spec.max_pixels_per_job // (request.width * request.height))
    most = 1 if spec.video else max(1, per_job) * spec.max_batch  # a video job: one clip
    calls = [request, replace(request, guidance_scale=1.0)]  # two rows (guided), one
    if most > 1:
        calls.append(replace(request, num_images=most))
    return calls


@contextlib.contextmanager
def running(model: LoadedModel, width: int, height: int, allowed: bool = True) -> Iterator[None]:
    """The context a call of this size runs in: as compiled where the model compiled
    this size and the call allows it (`allowed`: no step cache's hooks on the blocks, no
    ControlNet's residuals among the inputs, workers/call.py), else eager, under
    the compiler's `force_eager` stance (a process-wide setting: a worker process runs one
    call at a time, under the model's lock)."""
    if not model.compiled or (allowed and (width, height) in model.spec.compile_tiers):
        yield
        return
    import torch

    with torch.compiler.set_stance("force_eager"):
        yield
