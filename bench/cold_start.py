"""Cold start: from a worker process's start to the moment its first job can start.

    .venv/bin/python -m bench.cold_start [--models tiny tiny-sd3 tiny-flux sd15 sdxl] [--runs 3]
                                         [--compile [--scopes none model blocks]] [--calls 5]

Each run is a fresh Python process doing what a GPU worker's pool process does before
its first job (workers/runtime.py `build_runtime`): import torch, diffusers and the
worker's modules, read the weights (`from_pretrained`, by workers/pipelines.py
`load_model`), move them to the device, warm up (one short job through the worker's own
pipeline call). The phases are split:

- import: process start (the parent's spawn) to the worker's modules imported;
- load: `from_pretrained`; device: `.to(device)`; warm-up: the first short job;
- other: the rest of `load_model` (the weights' SHA-256 digest, checks).

`tiny*` are the tests' random-weight models (workers/tiny.py, workers/tiny_flow.py;
`tiny-flux-57` has the tiny FLUX's widths and FLUX.1's 19 + 38 blocks); `sd15`
and `sdxl` are bench/gpu.py's architecture-true SD 1.5 and SDXL with random weights (full
size and fp16 on a CUDA GPU, where SDXL's goal is 20 s from local disk; widths / 10 on a
CPU). The worker records load, device and warm-up of every
model it serves as `diffq_worker_model_start_seconds{model,phase}`.

`--compile`: each model also has a compile tier (its default size, inductor), so the
warm-up compiles it; the first run starts with an empty compile cache
(DIFFQ_COMPILE_CACHE, workers/compiled.py `use_compile_cache`), the later runs with what the
earlier ones kept: a worker's first start against its next ones. `--scopes`: the
catalog's `compile_scope` values to compare, each with a cache of its own (`model`, the
whole denoiser; `blocks`, its repeated blocks: regional compilation; `none`: eager, the
baseline); the warm-up gains its ratio to the first scope's, measured in the same run.
`--calls N`: after the warm-up, N 4-step calls at the tier's size (median seconds, and
the ratio to the first scope's).
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

FAMILY = {
    "tiny": "sd",
    "tiny-sd3": "sd3",
    "tiny-flux": "flux",
    "tiny-flux-57": "flux",
    "sd15": "sd",
    "sdxl": "sd",
}
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
    scope = os.environ.get("DIFFQ_BENCH_COMPILE_SCOPE", "auto")
    if os.environ.get("DIFFQ_COMPILE_CACHE") and scope != "none":
        from workers.compiled import use_compile_cache

        use_compile_cache(Path(os.environ["DIFFQ_COMPILE_CACHE"]))
        size = f"{spec.default_width}x{spec.default_height}"
        spec = replace(spec, compile_sizes=(size,), compile_backend="inductor", compile_scope=scope)
    preimport_components(spec)  # as the worker's main process does before forking
    import diffusers.pipelines  # noqa: F401  (DiffusionPipeline's own import)

    imported = time.time()
    model = load_model(spec, device)
    warm = warm_up(model)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    ready = time.time()
    calls = []
    for seed in range(int(os.environ.get("DIFFQ_BENCH_CALLS", "0"))):  # at the compiled size
        from testbed.factories import generate_one, job_request

        started = time.perf_counter()
        generate_one(model, job_request(spec, steps=4, seed=seed))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        calls.append(time.perf_counter() - started)
    print(
        json.dumps(
            {
                "call": statistics.median(calls) if calls else 0.0,
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
    if name == "tiny-flux-57":  # the tiny widths, FLUX.1's 19 + 38 blocks
        from workers.tiny import _saved
        from workers.tiny_flow import build_tiny_flux_pipeline

        return _saved(build_tiny_flux_pipeline(0, blocks=(19, 38)), path)
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
    parser.add_argument(
        "--scopes", nargs="+", default=["auto"], help="compile_scope values, with --compile"
    )
    parser.add_argument(
        "--calls", type=int, default=0, help="then time this many 4-step calls, at the tier's size"
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
    env["DIFFQ_BENCH_CALLS"] = str(args.calls)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = _build(name, Path(tmp), gpu)
            dtype = "float16" if gpu and name in FULL_SIZE else "float32"
            baseline: dict[str, dict] = {}  # the first scope's row, by start
            for scope in args.scopes if args.compile else [""]:
                runs = _runs(args.runs, path, name, device, dtype, env, tmp, scope)
                groups = [("", runs)]
                if args.compile:  # the first start (empty cache) apart from the later ones
                    how = "eager" if scope == "none" else f"compiled ({scope})"
                    groups = [(f" {how}, first start", runs[:1]), (f" {how}, later", runs[1:])]
                for label, group in groups:
                    if not group:
                        continue
                    row = {"model": name + label, "device": device, "runs": len(group)}
                    for phase in PHASES:
                        row[f"{phase} s"] = statistics.median(r[phase] for r in group)
                    first = baseline.setdefault(label.rsplit(",", 1)[-1], row)
                    for phase in ("warm-up", "call"):
                        row[f"{phase} x first"] = row[f"{phase} s"] / (first[f"{phase} s"] or 1)
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
            *(["warm-up x first"] if len(args.scopes) > 1 else []),
            "other s",
            "total s",
            *(["call s"] if args.calls else []),
            *(["call x first"] if args.calls and len(args.scopes) > 1 else []),
        ],
    )


PHASES = ("interpreter", "import", "load", "device", "warm-up", "other", "total", "call")


def _runs(count, path, name, device, dtype, env, tmp, scope) -> list[dict]:
    """`count` fresh worker processes' starts; with a scope, compiling into a cache of
    its own, empty for the first."""
    env = dict(env)
    if scope:
        env["DIFFQ_COMPILE_CACHE"] = str(Path(tmp) / f"compile-cache-{name}-{scope}")
        env["DIFFQ_BENCH_COMPILE_SCOPE"] = scope
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    runs = []
    for _ in range(count):
        spawned = time.time()
        command = [sys.executable, "-m", "bench.cold_start", "--child", str(path)]
        command += [FAMILY[name], device, dtype, repr(spawned)]
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs


if __name__ == "__main__":
    main()
