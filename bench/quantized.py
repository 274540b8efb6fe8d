"""Quantized weights (the catalog's `quantize`): memory, speed and deviation against the
same model unquantized, measured in one run through the worker's own loading and call.

    .venv/bin/python -m bench.quantized [--model tiny|sd15|sdxl] [--size N] [--steps N]
        [--rounds 5]

`tiny`: the tiny random-weight model; `sd15`, `sdxl`: random weights in the published
layouts (bench/gpu.py), full size in fp16 on a GPU, a tenth of the widths in float32 on the
CPU. Each variant (`none`, `int8`, and `fp8` where the device runs it: a GPU of compute
capability 8.9 or later) is loaded by `workers.pipelines.load_model`, then timed in
rotating rounds on the same seed (the median of `--rounds` calls per variant, after one
call to warm it); memory is the denoiser's bytes as loaded (quantized weights and their
scales); deviation is the PSNR of each variant's image against `none`'s from the same seed
(random weights measure numerics, not beauty). A variant the device cannot run is
printed with the reason.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

VARIANTS = ("", "int8", "fp8")


def _bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a - b) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("tiny", "sd15", "sdxl"), default="tiny")
    parser.add_argument("--size", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import torch

    from app.catalog import tiny_spec
    from testbed.factories import generate_one, job_request
    from workers.compiled import denoiser_name
    from workers.pipelines import ModelLoadError, load_model

    on_gpu = torch.cuda.is_available()
    device, dtype = ("cuda", "float16") if on_gpu else ("cpu", "float32")
    if not on_gpu:
        torch.set_num_threads(1)
    full_size = {"tiny": 64, "sd15": 512, "sdxl": 1024}[args.model]
    size = args.size or (full_size if on_gpu or args.model == "tiny" else full_size // 8)
    steps = args.steps or (20 if on_gpu else 4)
    root = Path(tempfile.mkdtemp())
    if args.model == "tiny":
        from workers.tiny import build_tiny_model

        path = build_tiny_model(root / "tiny")
    else:
        from bench import gpu

        path = root / args.model
        built = gpu.build(args.model, 1 if on_gpu else 10, device)
        built.to(getattr(torch, dtype)).save_pretrained(path)
    base = replace(
        tiny_spec(path, name=args.model),
        dtype=dtype,
        max_width=max(512, size),
        max_height=max(512, size),
        max_pixels=max(512, size) ** 2,
        max_steps=max(50, steps),
    )
    models, refused = {}, {}
    for variant in VARIANTS:
        try:
            models[variant] = load_model(replace(base, quantize=variant), device)
        except ModelLoadError as exc:
            refused[variant] = str(exc)
    request = job_request(steps=steps, width=size, height=size)

    def run(model, seed: int) -> np.ndarray:
        output = generate_one(model, replace(request, seed=seed))
        return np.asarray(output.images[0], dtype=np.float64)

    for model in models.values():
        run(model, 0)  # warm
    times: dict[str, list[float]] = {v: [] for v in models}
    for round_ in range(args.rounds):
        order = list(models)[round_ % len(models) :] + list(models)[: round_ % len(models)]
        for variant in order:
            started = time.perf_counter()
            run(models[variant], 1)
            if on_gpu:
                torch.cuda.synchronize()
            times[variant].append(time.perf_counter() - started)
    pictures = {v: run(m, 7) for v, m in models.items()}

    print(
        f"{args.model}: {size}x{size}, {steps} steps, {dtype} on {device}, median of "
        f"{args.rounds} calls each, rotating"
    )
    print(
        f"{'quantize':>8} {'denoiser MB':>12} {'memory':>8} {'s/call':>8} {'speed':>7} "
        f"{'PSNR dB':>8}"
    )
    full = models.get("")
    for variant, model in models.items():
        denoiser = getattr(model.pipeline, denoiser_name(model.pipeline))
        size = _bytes(denoiser)
        seconds = statistics.median(times[variant])
        memory = size / _bytes(getattr(full.pipeline, denoiser_name(full.pipeline)))
        speed = statistics.median(times[""]) / seconds
        psnr = _psnr(pictures[""], pictures[variant])
        print(
            f"{variant or 'none':>8} {size / 1e6:>12.2f} {memory:>7.2f}x {seconds:>8.3f} "
            f"{speed:>6.2f}x {psnr:>8.1f}"
        )
    for variant, reason in refused.items():
        print(f"{variant:>8} refused: {reason}")


if __name__ == "__main__":
    main()
