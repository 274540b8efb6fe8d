"""Quality tiers per model: the denoiser work each tier saves, its time, and how far its
images are from `exact`'s, through the worker's one call (workers/call.py).

    .venv/bin/python -m bench.quality [--models sd sd3 flux] [--seeds 4] [--steps 20]
                                      [--sweep 0.08 0.16 0.3 0.5]

Each model runs every tier it offers (its family's defaults, app/quality.py) on the same
seeds; `exact` is the baseline measured in the same run. Columns: denoiser rows (the
sample rows fed to the UNet or transformer, summed over the steps: a guidance cut feeds
one row a step instead of two) and attention runs (the attention blocks that ran: a step
cache skips them), each against `exact`; seconds an image and its ratio; PSNR against
`exact`'s image of the same seed (inf: identical). `--sweep` adds First Block Cache rows
at those thresholds for each transformer model: the calibration an operator runs on their
own weights to set `[models.NAME.tiers.TIER] threshold`.

On a CPU the models are the tiny random-weight ones (workers/tiny.py, workers/tiny_flow.py),
64²; with CUDA, `--layout published` builds SD 1.5 and SDXL in their published layouts
(bench/gpu.py) in fp16. Random weights measure numerics, not beauty: a trained model's
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

    if name in ("sd15", "sdxl"):
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
            component.eval()  # built in memory: as the worker's loader leaves them
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    pipeline.to(device, dtype)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline, family, size


def _model(name: str, device: str):
    from app.catalog import ModelSpec
    from workers.pipelines import LoadedModel

    pipeline, family, size = _pipeline(name, device)
    spec = ModelSpec(
        name=name,
        path=Path("/bench"),
        queue="bench",
        family=family,
        size_multiple=16 if family != "sd" else 8,
        default_width=size,
        default_height=size,
        max_steps=100,
    )
    return LoadedModel(spec, pipeline, device, 0.0), size


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


def _run(model, size: int, tier: str, seed: int, steps: int):
    import numpy as np

    from app.kinds import KINDS
    from workers.call import generate

    data = {"prompt": "a lighthouse on a cliff at dusk", "seed": seed, "steps": steps}
    job = KINDS["txt2img"].normalize(
        model.spec, {**data, "width": size, "height": size, "quality": tier}
    )
    started = time.perf_counter()
    [out] = generate(model, [job], on_step=[lambda *_: True])
    seconds = time.perf_counter() - started
    return np.asarray(out.images[0], dtype=np.float64) / 255.0, seconds


def _psnr(a, b) -> float:
    mse = float(((a - b) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def measure(name: str, device: str, seeds: int, steps: int, sweep: list[float]) -> list[dict]:
    from app.quality import Tier

    model, size = _model(name, device)
    counts = _counters(model.pipeline)
    tiers = [(tier.name, tier) for tier in model.spec.tiers]
    if sweep and model.spec.family in ("flux", "wan", "ltx"):
        known = {t.threshold for _, t in tiers if t.step_cache == "first_block"}
        tiers += [
            ("sweep", Tier("fast", step_cache="first_block", threshold=t))
            for t in sweep
            if t not in known
        ]
    _run(model, size, "exact", 0, 1)  # warm: first-call allocations out of the timing
    exact_images, rows = [], []
    for label, tier in tiers:
        offered = (Tier("exact"),) if tier.name == "exact" else (Tier("exact"), tier)
        model.spec = replace(model.spec, tiers=offered)  # this tier's settings under its name
        counts.update(rows=0, attention=0)
        images, seconds = [], []
        for seed in range(seeds):
            image, took = _run(model, size, tier.name, seed, steps)
            images.append(image)
            seconds.append(took)
        if tier.name == "exact":
            exact_images, base = images, (counts["rows"], counts["attention"], sum(seconds))
        psnr = min(_psnr(a, b) for a, b in zip(images, exact_images, strict=True))
        settings = ", ".join(f"{k} {v}" for k, v in tier.settings().items())
        rows.append(
            {
                "model": name,
                "tier": label,
                "settings": settings or "as loaded",
                "denoiser rows": f"{counts['rows'] / base[0]:.2f}x",
                "attention runs": f"{counts['attention'] / max(1, base[1]):.2f}x",
                "s/image": sum(seconds) / seeds,
                "vs exact": f"{base[2] / sum(seconds):.2f}x",
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
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)
    rows = []
    for name in args.models:
        rows += measure(name, device, args.seeds, args.steps, args.sweep)
    columns = ["model", "tier", "settings", "denoiser rows", "attention runs", "s/image"]
    print_table(
        f"Quality tiers on {device}, {args.steps} steps, {args.seeds} seeds (baseline: exact, "
        "same run)",
        rows,
        [*columns, "vs exact", "min PSNR dB"],
    )
    print("\nFor the catalog (GET /v1/models shows each tier's psnr):")
    for row in rows:
        if row["tier"] not in ("exact", "sweep") and math.isfinite(row["min PSNR dB"]):
            print(f"[models.{row['model']}.tiers.{row['tier']}]  # {row['settings']}")
            print(f"psnr = {row['min PSNR dB']:.1f}")


if __name__ == "__main__":
    main()
