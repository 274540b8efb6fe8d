"""Dynamic batching: images/s and job latency at max_batch 1, 2, 4, 8, same model and load.

    .venv/bin/python -m bench.batching [--model tiny|sd15|sdxl] [--size 64] [--steps 8]
        [--jobs 48] [--load 0.8 3] [--batches 1 2 4 8] [--wait-ms 50] [--threads 1]

First, one pipeline call per batch size back to back (the ceiling batching can reach).
Then jobs arrive open-loop at a fixed rate (`--load` times the images/s that batch 1 sustains,
measured first in the same run), each with its own prompt and seed. One server runs them
as the worker does (workers/gather.py, workers/call.py): it takes the oldest waiting job,
waits up to `--wait-ms` for compatible ones (up to max_batch), runs them as one call and
records each job's latency from its arrival to its images. Every batch size gets the
same arrival times. Pipeline time only: encode, upload and record are off the GPU's path
(docs/gpu.md) and do not change with batching.

`--model tiny` is the tests' random-weight model (CPU is fine). `sd15` and `sdxl` are the
architecture-true random-weight pipelines of bench/gpu.py, in full on a CUDA GPU (fp16,
512² and 1024²), scaled down on a CPU (whose figures say nothing about a GPU).
"""

from __future__ import annotations

import argparse
import random
import time

from bench.report import percentile, print_table


def _pipeline(model: str, device: str):
    import torch

    if model == "tiny":
        from workers.tiny import build_tiny_pipeline

        pipeline = build_tiny_pipeline(0)
    else:
        from bench.gpu import build

        pipeline = build(model, 1 if device == "cuda" else 10)
        if device == "cuda":
            pipeline = pipeline.to(torch.float16)
    pipeline.set_progress_bar_config(disable=True)
    from pathlib import Path

    from app.catalog import tiny_spec
    from workers.pipelines import LoadedModel

    return LoadedModel(tiny_spec(Path("/bench"), name="bench"), pipeline.to(device), device, 0.0)


def _params(index: int, size: int, steps: int):
    from testbed.factories import job_request

    return job_request(
        model="bench",
        prompt=f"a red cube number {index}",
        width=size,
        height=size,
        steps=steps,
        seed=index,
    )


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def serve(pipeline, device, arrivals, jobs, max_batch, wait_s) -> dict:
    """Run `jobs` arriving at `arrivals` (seconds from now); per-job latency, batch sizes."""
    from workers.call import generate

    start = time.perf_counter()
    latencies: list[float] = []
    sizes: list[int] = []
    waited: list[float] = []
    next_job = 0
    while next_job < len(jobs):
        now = time.perf_counter() - start
        if arrivals[next_job] > now:  # nothing waiting: idle until the next arrival
            time.sleep(arrivals[next_job] - now)
            continue
        picked = time.perf_counter() - start
        fill_until = picked + wait_s
        while True:  # collect: up to max_batch, for at most wait_s
            now = time.perf_counter() - start
            ready = sum(1 for a in arrivals[next_job : next_job + max_batch] if a <= now)
            if ready >= max_batch or now >= fill_until or max_batch == 1:
                break
            upcoming = arrivals[next_job + ready] if next_job + ready < len(arrivals) else None
            if upcoming is None:
                break
            time.sleep(max(0.0, min(fill_until, upcoming) - now))
        taken = list(range(next_job, next_job + max(1, ready)))
        waited.append(time.perf_counter() - start - picked)
        generate(pipeline, [jobs[i] for i in taken], on_step=[lambda s, t: True] * len(taken))
        _sync(device)
        done = time.perf_counter() - start
        latencies += [done - arrivals[i] for i in taken]
        sizes.append(len(taken))
        next_job += len(taken)
    makespan = time.perf_counter() - start - arrivals[0]
    return {
        "images_per_s": len(jobs) / makespan,
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
        "mean_batch": sum(sizes) / len(sizes),
        "wait_ms": 1000 * sum(waited) / len(waited),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", "sd15", "sdxl"])
    parser.add_argument("--size", type=int, help="square side (default: the model's own)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=48)
    parser.add_argument(
        "--load", type=float, nargs="+", default=[0.8, 3.0], help="x batch 1's images/s"
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--wait-ms", type=float, default=50)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on a CPU")
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per batch size")
    args = parser.parse_args()

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(args.threads)
    default_size = {"tiny": 64, "sd15": 512, "sdxl": 1024}[args.model]
    size = args.size or (default_size if device == "cuda" or args.model == "tiny" else 64)
    pipeline = _pipeline(args.model, device)
    jobs = [_params(i, size, args.steps) for i in range(args.jobs)]
    from workers.call import generate

    name = torch.cuda.get_device_name() if device == "cuda" else f"cpu ({args.threads} thread)"
    # Back to back, no arrivals: what one call of each batch size costs (after a warm-up
    # call each: allocator, kernel choice). Batch 1's images/s sets the offered loads.
    calls = []
    for b in args.batches:
        steps = [lambda s, t: True] * b
        generate(pipeline, jobs[:b], on_step=steps)
        _sync(device)
        seconds = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            generate(pipeline, jobs[:b], on_step=steps)
            _sync(device)
            seconds.append(time.perf_counter() - started)
        best = min(seconds)
        calls.append({"batch": b, "s_per_call": best, "images_per_s": b / best})
    for row in calls:
        row["x_images_per_s"] = row["images_per_s"] / calls[0]["images_per_s"]
    print_table(
        f"{args.model} {size}x{size}, {args.steps} steps, one call per batch size "
        f"(best of {args.rounds}), on {name}",
        calls,
        ["batch", "s_per_call", "images_per_s", "x_images_per_s"],
    )
    capacity = calls[0]["images_per_s"]
    for load in args.load:
        _run(args, pipeline, device, jobs, size, capacity, load, name)


def _run(args, pipeline, device, jobs, size, capacity, load, name) -> None:
    rate = capacity * load
    rng = random.Random(0)
    arrivals, t = [], 0.0
    for _ in jobs:  # Poisson arrivals, the same for every batch size
        arrivals.append(t)
        t += rng.expovariate(rate)

    rows = []
    for b in args.batches:
        row = serve(pipeline, device, arrivals, jobs, b, args.wait_ms / 1000 if b > 1 else 0)
        rows.append({"max_batch": b, **row})
    base = rows[0]
    for row in rows:
        row["x_images_per_s"] = row["images_per_s"] / base["images_per_s"]
        row["x_p99"] = row["p99_s"] / base["p99_s"]
    print_table(
        f"{args.model} {size}x{size}, {args.steps} steps, {args.jobs} jobs arriving at "
        f"{rate:.2f}/s ({load:g}x batch 1's {capacity:.2f} images/s), "
        f"max_wait_ms {args.wait_ms:g}, on {name}",
        rows,
        [
            "max_batch",
            "images_per_s",
            "x_images_per_s",
            "p50_s",
            "p99_s",
            "x_p99",
            "mean_batch",
            "wait_ms",
        ],
    )


if __name__ == "__main__":
    main()
