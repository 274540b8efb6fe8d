"""Quality tiers per model: the denoiser work each tier saves, its time, and how far its
images are from `exact`'s, through the worker's one call (workers/call.py).

    .venv/bin/python -m bench.quality [--models sd sd3 flux] [--seeds 4] [--steps 20]
                                      [--sweep 0.08 0.16 0.3 0.5] [--compile]

Each model runs every tier it offers (its family's defaults, app/quality.py) on the same
seeds; `exact` is the baseline measured in the same run. Columns: denoiser rows (the
sample rows fed to the UNet or transformer, summed over the steps: a guidance cut feeds
one row a step instead of two) and attention runs (the attention blocks that ran: a step
cache skips them), each against `exact`; seconds an image and its ratio; PSNR against
`exact`'s image of the same seed (inf: identical). `--sweep` adds First Block Cache rows
at those thresholds for each transformer model: the calibration an operator runs on their
own weights to set `[models.NAME.tiers.TIER] threshold`.

Each model's first row, `bare`, is its pipeline called directly with the keywords the
worker gives it for `exact`, on the same seeds (% of bare: its seconds against each
row's; its PSNR against `exact`'s images: inf where the worker's call makes the same
bytes as the bare one, as it does eager).
`--compile` runs each model again with the worker's own compile at the bench's size,
warmed as a worker warms it (inductor on a GPU; `auto` scope: a transformer's blocks, a
UNet whole), bare and tiers on the same compiled module.

On a CPU the models are the tiny random-weight ones (workers/tiny.py, workers/tiny_flow.py),
64²; `sd15`, `sdxl` and `flux-dev` are the published layouts with random weights
(bench/gpu.py): in full on CUDA (fp16; FLUX.1-dev in bf16 at 1024²), widths divided on a
CPU. Random weights measure numerics, not beauty: a trained model's
deviation at a threshold differs, which is why the thresholds are per model.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace
from pathlib import Path

from bench.report import print_table


def _pipeline(name: str, device: str):
    import torch

    gpu = device.startswith("cuda")
    if name == "flux-dev":
        from bench.gpu import build_flux_dev

        pipeline = build_flux_dev(1 if gpu else 16, device, torch.bfloat16 if gpu else None)
        family, size = "flux", 1024 if gpu else 64
    elif name in ("sd15", "sdxl"):
        from bench.gpu import build

        pipeline = build(name, 1 if device.startswith("cuda") else 10)
        family, size = "sd", (512 if name == "sd15" else 1024)
        if not device.startswith("cuda"):
            size //= 8
    else:
        from workers.tiny import build_tiny_pipeline
        from workers.tiny_flow import build_tiny_flux_pipeline, build_tiny_sd3_pipeline

        builders = {
            "sd": build_tiny_pipeline,
            "sd3": build_tiny_sd3_pipeline,
            "flux": build_tiny_flux_pipeline,
        }
        pipeline, family, size = builders[name](seed=0), name, 64
    for component in pipeline.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()  # built in memory: as the worker's loader leaves them (no dropout)
    if name != "flux-dev":  # FLUX.1-dev is made where and as it runs
        pipeline.to(device, torch.float16 if gpu else torch.float32)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline, family, size


def _model(name: str, device: str, compiled: bool = False):
    """The model as a worker holds it; `compiled`: its speed profile's compile, the
    worker's own (workers/compiled.py, `auto` scope: FLUX's blocks, a UNet whole), at the
    bench's size, warmed as a worker warms it (inductor on a GPU, dynamo's capture alone
    on a CPU)."""
    from app.catalog import ModelSpec
    from workers.compiled import compile_denoiser
    from workers.pipelines import LoadedModel, warm_up

    pipeline, family, size = _pipeline(name, device)
    spec = ModelSpec(
        name=name,
        path=Path("/bench"),
        queue="bench",
        family=family,
        size_multiple=16 if family != "sd" else 8,
        default_width=size,
        default_height=size,
        max_width=max(1024, size),
        max_height=max(1024, size),
        max_pixels=max(1024, size) ** 2,
        max_steps=100,
        compile_sizes=(f"{size}x{size}",) if compiled else (),
        compile_backend="inductor" if device.startswith("cuda") else "eager",
    )
    model = LoadedModel(spec, pipeline, device, 0.0)
    if compiled:
        compile_denoiser(model)
        warm_up(model)
    return model, size


def _counters(pipeline):
    """(rows fed to the denoiser, attention blocks run), counted by forward pre-hooks."""
    from workers.compiled import denoiser_name

    denoiser = getattr(pipeline, denoiser_name(pipeline))
    counts = {"rows": 0, "attention": 0}

    def rows(_module, args, kwargs):
        sample = args[0] if args else next(iter(kwargs.values()))
        counts["rows"] += sample.shape[0]

    def attention(*_):
        counts["attention"] += 1

    denoiser.register_forward_pre_hook(rows, with_kwargs=True)
    for name, module in denoiser.named_modules():
        if name.endswith(("attn.to_q", "attn1.to_q")):
            module.register_forward_pre_hook(attention)
    return counts


def _job(model, size: int, tier: str, seed: int, steps: int):
    from app.kinds import KINDS

    data = {"prompt": "a lighthouse on a cliff at dusk", "seed": seed, "steps": steps}
    return KINDS["txt2img"].normalize(
        model.spec, {**data, "width": size, "height": size, "quality": tier}
    )


def _run(model, size: int, tier: str, seed: int, steps: int):
    import numpy as np

    from workers.call import generate

    job = _job(model, size, tier, seed, steps)
    started = time.perf_counter()
    [out] = generate(model, [job], on_step=[lambda *_: True])
    seconds = _synced(model.device, started)
    return np.asarray(out.images[0], dtype=np.float64) / 255.0, seconds


def _bare(model, size: int, seed: int, steps: int):
    """The pipeline called directly with the keywords the worker gives it for `exact`
    (app/kinds), the same seed: no worker around it."""
    import numpy as np
    import torch

    from app.kinds import KINDS

    job = _job(model, size, "exact", seed, steps)
    arguments = KINDS["txt2img"].call_arguments([job])
    generator = torch.Generator(device=model.device).manual_seed(job.image_seed(0))
    started = time.perf_counter()
    with torch.inference_mode():
        image = model.pipeline(**arguments, generator=generator).images[0]
    seconds = _synced(model.device, started)
    return np.asarray(image, dtype=np.float64) / 255.0, seconds


def _synced(device: str, started: float) -> float:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started


def _psnr(a, b) -> float:
    mse = float(((a - b) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def measure(
    name: str, device: str, seeds: int, steps: int, sweep: list[float], compiled: bool = False
) -> list[dict]:
    """A `bare` row (the pipeline called directly, the worker's keywords) then each tier
    through the worker's call, on the same seeds. Compiled, the denoiser's work is not
    counted: hooks put on a compiled module would make it compile again."""
    from app.quality import Tier

    model, size = _model(name, device, compiled)
    counts = None if compiled else _counters(model.pipeline)
    tiers = [(tier.name, tier) for tier in model.spec.tiers]
    if sweep and model.spec.family in ("flux", "wan", "ltx"):
        known = {t.threshold for _, t in tiers if t.step_cache == "first_block"}
        tiers += [
            ("sweep", Tier("fast", step_cache="first_block", threshold=t))
            for t in sweep
            if t not in known
        ]
    _run(model, size, "exact", 0, 1)  # warm: first-call allocations out of the timing
    _bare(model, size, 0, 1)
    label_model = f"{name} (compiled)" if compiled else name
    bare = [_bare(model, size, seed, steps) for seed in range(seeds)]
    bare_seconds = sum(took for _, took in bare)
    exact_images, rows = [], []
    base = (0, 0, 0.0)
    for label, tier in tiers:
        offered = (Tier("exact"),) if tier.name == "exact" else (Tier("exact"), tier)
        model.spec = replace(model.spec, tiers=offered)  # this tier's settings under its name
        if counts is not None:
            counts.update(rows=0, attention=0)
        images, seconds = [], []
        for seed in range(seeds):
            image, took = _run(model, size, tier.name, seed, steps)
            images.append(image)
            seconds.append(took)
        done = (counts["rows"], counts["attention"]) if counts is not None else (0, 0)
        if tier.name == "exact":
            exact_images, base = images, (*done, sum(seconds))
            rows.append(
                {
                    "model": label_model,
                    "tier": "bare",
                    "settings": "the pipeline called directly",
                    "s/image": bare_seconds / seeds,
                    "vs exact": f"{base[2] / bare_seconds:.2f}x",
                    "% of bare": 100.0,
                    "min PSNR dB": min(_psnr(a, b) for (a, _), b in zip(bare, images, strict=True)),
                }
            )
        psnr = min(_psnr(a, b) for a, b in zip(images, exact_images, strict=True))
        settings = ", ".join(f"{k} {v}" for k, v in tier.settings().items())
        rows.append(
            {
                "model": label_model,
                "tier": label,
                "settings": settings or "as loaded",
                "denoiser rows": f"{done[0] / base[0]:.2f}x" if counts is not None else "-",
                "attention runs": (
                    f"{done[1] / max(1, base[1]):.2f}x" if counts is not None else "-"
                ),
                "s/image": sum(seconds) / seeds,
                "vs exact": f"{base[2] / sum(seconds):.2f}x",
                "% of bare": 100 * bare_seconds / sum(seconds),
                "min PSNR dB": psnr,
            }
        )
    return rows


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["sd", "sd3", "flux"])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sweep", type=float, nargs="*", default=[0.08, 0.16, 0.3, 0.5])
    parser.add_argument(
        "--compile", action="store_true", help="then each model again with its compile"
    )
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)
    rows = []
    for name in args.models:
        rows += measure(name, device, args.seeds, args.steps, args.sweep)
        if args.compile:
            rows += measure(name, device, args.seeds, args.steps, [], compiled=True)
    columns = ["model", "tier", "settings", "denoiser rows", "attention runs", "s/image"]
    print_table(
        f"Quality tiers on {device}, {args.steps} steps, {args.seeds} seeds (baseline: exact, "
        "same run)",
        rows,
        [*columns, "vs exact", "% of bare", "min PSNR dB"],
    )
    print("\nFor the catalog (GET /v1/models shows each tier's psnr):")
    for row in rows:
        compiled = row["model"].endswith("(compiled)")
        if row["tier"] in ("exact", "sweep", "bare") or compiled:
            continue
        if math.isfinite(row["min PSNR dB"]):
            print(f"[models.{row['model']}.tiers.{row['tier']}]  # {row['settings']}")
            print(f"psnr = {row['min PSNR dB']:.1f}")


if __name__ == "__main__":
    main()
