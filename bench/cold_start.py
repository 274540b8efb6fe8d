"""Cold start: from a worker process's start to the moment its first job can start.

    .venv/bin/python -m bench.cold_start [--models tiny tiny-sd3 tiny-flux sd15 sdxl] [--runs 3]
                                         [--compile]

Each run is a fresh Python process doing what a GPU worker's pool process does before
its first job (workers/runtime.py `build_runtime`): import torch, diffusers and the
worker's modules, read the weights (`from_pretrained`, by workers/pipelines.py
`load_model`), move them to the device, warm up (one short job through the worker's own
pipeline call). The phases are split:

- import: process start (the parent's spawn) to the worker's modules imported;
- load: `from_pretrained`; device: `.to(device)`; warm-up: the first short job;
- other: the rest of `load_model` (the weights' SHA-256 digest, checks).

`tiny*` are the tests' random-weight models (workers/tiny.py, workers/tiny_flow.py); `sd15`
and `sdxl` are bench/gpu.py's architecture-true SD 1.5 and SDXL with random weights (full
size and fp16 on a CUDA GPU, where SDXL's goal is 20 s from local disk; widths / 10 on a
CPU). The worker records load, device and warm-up of every
model it serves as `diffq_worker_model_start_seconds{model,phase}`.

`--compile`: each model also has a compile tier (its default size, inductor), so the
warm-up compiles it; the first run starts with an empty compile cache
(DIFFQ_COMPILE_CACHE, workers/compiled.py `use_compile_cache`), the later runs with what the
earlier ones kept: a worker's first start against its next ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import print_table

FAMILY = {"tiny": "sd", "tiny-sd3": "sd3", "tiny-flux": "flux", "sd15": "sd", "sdxl": "sd"}
FULL_SIZE = ("sd15", "sdxl")  # bench/gpu.py's: fp16 on a GPU


def _child(path: str, family: str, device: str, dtype: str, spawned: float) -> None:
    from dataclasses import replace

    imported_started = time.time()
    import torch

    from app.catalog import tiny_spec
    from workers.pipelines import load_model, preimport_components, warm_up

    spec = tiny_spec(Path(path))
    spec = replace(spec, family=family, schedulers=("default",), dtype=dtype)
    if family != "sd":
        spec = replace(spec, size_multiple=16)
    if os.environ.get("DIFFQ_COMPILE_CACHE"):
        from workers.compiled import use_compile_cache

        use_compile_cache(Path(os.environ["DIFFQ_COMPILE_CACHE"]))
        size = f"{spec.default_width}x{spec.default_height}"
        spec = replace(spec, compile_sizes=(size,), compile_backend="inductor")
    preimport_components(spec)  # as the worker's main process does before forking
    import diffusers.pipelines  # noqa: F401  (DiffusionPipeline's own import)

    imported = time.time()
    model = load_model(spec, device)
    warm = warm_up(model)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    ready = time.time()
    print(
        json.dumps(
            {
                "interpreter": imported_started - spawned,
                "import": imported - spawned,
                "load": model.load_seconds,
                "device": model.device_seconds,
                "warm-up": warm,
                # the rest: the weights' digest (workers/manifest.py), loading's checks
                "other": (ready - imported) - model.load_seconds - model.device_seconds - warm,
                "total": ready - spawned,
            }
        ),
        flush=True,
    )


def _build(name: str, root: Path, gpu: bool) -> Path:
    from workers.tiny import build_tiny_model

    path = root / name
    if name in FULL_SIZE:
        from bench.gpu import build

        pipeline = build(name, 1 if gpu else 10)
        if gpu:
            pipeline = pipeline.to(dtype=__import__("torch").float16)  # what is on disk
        pipeline.save_pretrained(path)
        return path
    return build_tiny_model(path, family=FAMILY[name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "tiny-sd3", "tiny-flux"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--compile", action="store_true", help="a compile tier, cache cold then kept"
    )
    parser.add_argument("--child", nargs=5, metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, family, device, dtype, spawned = args.child
        _child(path, family, device, dtype, float(spawned))
        return
    import torch

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = _build(name, Path(tmp), gpu)
            dtype = "float16" if gpu and name in FULL_SIZE else "float32"
            if args.compile:
                env["DIFFQ_COMPILE_CACHE"] = str(Path(tmp) / f"compile-cache-{name}")
                env.pop("TORCHINDUCTOR_CACHE_DIR", None)
            runs = []
            for _ in range(args.runs):
                spawned = time.time()
                command = [sys.executable, "-m", "bench.cold_start", "--child", str(path)]
                command += [FAMILY[name], device, dtype, repr(spawned)]
                out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            groups = [("", runs)]
            if args.compile:  # the first start (empty cache) apart from the later ones
                groups = [(" compiled, first start", runs[:1]), (" compiled, cache kept", runs[1:])]
            for label, group in groups:
                if not group:
                    continue
                row = {"model": name + label, "device": device, "runs": len(group)}
                for phase in (
                    "interpreter",
                    "import",
                    "load",
                    "device",
                    "warm-up",
                    "other",
                    "total",
                ):
                    row[f"{phase} s"] = statistics.median(r[phase] for r in group)
                rows.append(row)
                print(row, flush=True)
    print_table(
        f"Cold start, process start to first job ready (median of {args.runs} runs, {device})",
        rows,
        [
            "model",
            "device",
            "runs",
            "import s",
            "load s",
            "device s",
            "warm-up s",
            "other s",
            "total s",
        ],
    )


if __name__ == "__main__":
    main()
