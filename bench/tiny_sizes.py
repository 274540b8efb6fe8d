"""Seconds per image size for the tiny model, run as the worker runs it (CPU, float32).

    .venv/bin/python -m bench.tiny_sizes [--sizes 64,128,256,512] [--steps 2 8] [--rounds 3]
        [--model DIR]

Builds the tiny model from the current code into a temporary folder (or takes a saved
one with --model, e.g. one built by an older version, for a before/after), loads and warms it
as a worker does, then times `generate_images` at each square size and step count (the
median of `--rounds` runs). The embedded catalog's largest size must finish well inside
its soft time limit at the default steps. CPU seconds are reported beside wall seconds:
on a shared machine they move far less than the wall clock (use --threads 1 there).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.report import print_table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="64,128,256,512")
    parser.add_argument("--steps", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", type=Path, help="a saved model folder instead of a new one")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    args = parser.parse_args()

    import torch

    from app.catalog import tiny_spec
    from testbed.factories import generate_one, job_request
    from workers.pipelines import load_model, warm_up
    from workers.tiny import build_tiny_model

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or build_tiny_model(Path(tmp) / "tiny")
        weights = sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file())
        spec = tiny_spec(model_dir)
        model = load_model(spec, "cpu")
        warm_up(model)
        rows = []
        for size in (int(s) for s in args.sizes.split(",")):
            for steps in args.steps:
                request = job_request(
                    spec,
                    prompt="a benchmark",
                    width=size,
                    height=size,
                    steps=steps,
                    guidance_scale=spec.default_guidance,
                    seed=1,
                )
                runs, cpu = [], []
                for _ in range(args.rounds):
                    started, cpu_started = time.perf_counter(), time.process_time()
                    generate_one(model, request)
                    runs.append(time.perf_counter() - started)
                    cpu.append(time.process_time() - cpu_started)
                rows.append(
                    {
                        "size": f"{size}x{size}",
                        "steps": steps,
                        "median_s": statistics.median(runs),
                        "min_s": min(runs),
                        "max_s": max(runs),
                        "cpu_s": statistics.median(cpu),
                    }
                )
                print(rows[-1], flush=True)
    print_table(
        f"tiny model on CPU ({torch.get_num_threads()} threads, weights {weights / 1e6:.1f} MB, "
        f"soft limit {spec.soft_time_limit} s at {spec.default_steps} steps)",
        rows,
        ["size", "steps", "median_s", "min_s", "max_s", "cpu_s"],
    )


if __name__ == "__main__":
    main()
