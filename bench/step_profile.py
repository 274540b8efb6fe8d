"""Where a job through diffq loses time against the bare pipeline call.

    .venv/bin/python -m bench.step_profile [--model sd15|sdxl] [--steps 20] [--rounds 4]
        [--compile] [--trace DIR]

Three paths on the same architecture-true random weights (bench/gpu.py's): the bare
diffusers call; the worker's pipeline call alone (workers.call.generate on the model the
worker loaded: no database, no thread beside it); and a whole job through
workers.execute on the embedded stores (claim, progress, the call, encode, store,
outcome). Printed:

- unprofiled rounds, each path first, second and third in turn: p50, min and max ms and
  the ratio to bare (the call alone against bare says what the call costs; the job
  against the call, what the job around it costs);
- each thread's CPU a job (the launching thread's, the encoder's, the progress writer's);
- one run of each path under torch.profiler: the GPU's busy ms (kernels, overlaps
  merged) and its idle share between the first kernel and the last (a launch-bound loop,
  or a host sync, leaves the GPU waiting), host syncs (cudaStreamSynchronize,
  cudaDeviceSynchronize, cudaEventSynchronize), device-to-host copies, Python's garbage
  collections by generation and their ms;
- the operators whose self CPU time or count differs most between the job and bare.

On a CPU the GPU columns are empty and the widths are scaled down as in bench/gpu.py.
`--trace DIR` writes the three Chrome traces (open in Perfetto)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench import gpu
from bench.report import print_table


class Collections:
    """Python's garbage collections while entered: count by generation, and seconds."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = 0.0
        self._started = 0.0

    def _hook(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._started

    def __enter__(self) -> Collections:
        gc.callbacks.append(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._hook)


class Profiled:
    """torch.profiler and the collections around one run; `summary()` after it."""

    def __init__(self, gpu_on: bool) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu_on else [])
        self.profiler = profile(activities=activities)
        self.collections = Collections()
        self.wall = 0.0

    @contextlib.contextmanager
    def __call__(self):
        started = time.perf_counter()
        with self.profiler, self.collections:
            yield
        self.wall = time.perf_counter() - started

    def summary(self) -> dict:
        from torch.autograd import DeviceType

        spans = sorted(
            (e.time_range.start, e.time_range.end)
            for e in self.profiler.events()
            if e.device_type == DeviceType.CUDA
        )
        busy, end = 0.0, None
        for start, stop in spans:  # kernels and copies, overlaps merged
            if end is None or start > end:
                busy += stop - start
                end = stop
            elif stop > end:
                busy += stop - end
                end = stop
        window = (spans[-1][1] - spans[0][0]) if spans else 0.0
        averages = {e.key: e for e in self.profiler.key_averages()}
        syncs = sum(
            e.count
            for key, e in averages.items()
            if key in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
        )
        to_host = sum(e.count for key, e in averages.items() if "DtoH" in key)
        gen = self.collections.count
        return {
            "wall ms": self.wall * 1000,
            "GPU busy ms": busy / 1000 if spans else None,
            "GPU idle %": 100 * (1 - busy / window) if window else None,
            "host syncs": syncs,
            "to host": to_host,
            "gc 0/1/2": f"{gen[0]}/{gen[1]}/{gen[2]}",
            "gc ms": self.collections.seconds * 1000,
            "ops": {key: (e.count, e.self_cpu_time_total / 1000) for key, e in averages.items()},
        }


def differences(bare: dict, diffq: dict, top: int) -> list[dict]:
    """The operators whose self CPU ms differs most, then those whose count differs."""
    rows = []
    for key in set(bare) | set(diffq):
        count_b, ms_b = bare.get(key, (0, 0.0))
        count_d, ms_d = diffq.get(key, (0, 0.0))
        rows.append(
            {
                "operator": key[:48],
                "bare count": count_b,
                "diffq count": count_d,
                "bare ms": ms_b,
                "diffq ms": ms_d,
                "+ms": ms_d - ms_b,
            }
        )
    by_time = sorted(rows, key=lambda r: -abs(r["+ms"]))[:top]
    by_count = [
        r
        for r in sorted(rows, key=lambda r: -abs(r["diffq count"] - r["bare count"]))
        if r["diffq count"] != r["bare count"] and r not in by_time
    ][: top // 2]
    return by_time + by_count


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each of this process's threads so far, by name (Linux: /proc)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    seconds: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue  # ended meanwhile
        name = names.get(int(tid), f"{comm} (native)")
        seconds[name] = seconds.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return seconds


class ThreadCpu:
    """The CPU seconds each thread spent while entered, summed over every entry."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self):
        before = thread_cpu()
        yield
        for name, seconds in thread_cpu().items():
            self.spent[name] = self.spent.get(name, 0.0) + seconds - before.get(name, 0.0)


def print_timed(title: str, seconds: dict[str, list[float]], threads: ThreadCpu) -> None:
    """The unprofiled rounds' table and the threads' CPU, printed as soon as they are measured."""
    bare_p50 = statistics.median(seconds["bare diffusers"])
    timed = [
        {
            "path": name,
            "p50 ms": statistics.median(values) * 1000,
            "min ms": min(values) * 1000,
            "max ms": max(values) * 1000,
            "vs bare %": 100 * bare_p50 / statistics.median(values),
        }
        for name, values in seconds.items()
    ]
    print_table(
        title,
        timed,
        ["path", "p50 ms", "min ms", "max ms", "vs bare %"],
    )
    jobs = len(seconds["a job through diffq"])
    print_table(
        f"CPU seconds a job, by thread, over the {jobs} timed jobs",
        [
            {"thread": name, "CPU ms a job": 1000 * spent / jobs}
            for name, spent in sorted(threads.spent.items(), key=lambda kv: -kv[1])
            if spent > 0
        ],
        ["thread", "CPU ms a job"],
    )


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["sd15", "sdxl"], default="sd15")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--rounds", type=int, help="timed rounds of the three paths")
    parser.add_argument("--compile", action="store_true", help="the UNet torch.compile'd")
    parser.add_argument("--trace", type=Path, help="write the Chrome traces here")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"
    device, dtype = ("cuda", torch.float16) if on_gpu else ("cpu", torch.float32)
    scale = 1 if on_gpu else 10
    size = (
        {"sd15": 512, "sdxl": 1024}[args.model] if on_gpu else {"sd15": 64, "sdxl": 128}[args.model]
    )
    steps = args.steps or (20 if on_gpu else 3)
    rounds = args.rounds or (4 if on_gpu else 2)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        gpu.embedded_environment(root, device)
        path = root / args.model
        gpu.build(args.model, scale, device).to(dtype).save_pretrained(path)
        (root / "models.toml").write_text(
            gpu.MODELS_TOML.format(
                name=args.model,
                path=path,
                size=size,
                pixels=size * size,
                dtype="float16" if on_gpu else "float32",
            )
        )
        from diffusers import DiffusionPipeline

        pipeline = DiffusionPipeline.from_pretrained(str(path), dtype=dtype).to(device)
        pipeline.set_progress_bar_config(disable=True)
        if args.compile:
            pipeline.unet = torch.compile(pipeline.unet)
        diffq = gpu.DiffqPath(args.model, size, steps, args.compile)
        try:
            paths = {
                "bare diffusers": lambda around=contextlib.nullcontext: gpu._bare(
                    pipeline, device, size, steps, 1, around=around
                )[0],
                "diffq's call alone": diffq.call,
                "a job through diffq": diffq.job,
            }
            for run in paths.values():  # warm-up (bare warms itself too)
                run()
            diffq.drain()
            with Profiled(on_gpu)():  # the profiler's own start-up, paid once here
                torch.zeros(8, device=device).add_(1)
            threads = ThreadCpu()
            seconds: dict[str, list[float]] = {name: [] for name in paths}
            names = list(paths)
            for r in range(rounds):  # each path first, second and third in turn
                for name in names[r % 3 :] + names[: r % 3]:
                    job = name == "a job through diffq"
                    with threads() if job else contextlib.nullcontext():
                        seconds[name].append(paths[name]())
                        # A job's encode and store, overlapped with the next job in a
                        # worker, end before the next path: they weigh on no path's time
                        # (bench.gpu's back-to-back rows count them), and their threads'
                        # CPU is counted as the job's.
                        diffq.drain()
            diffq.drain()
            where = torch.cuda.get_device_name(0) if on_gpu else "CPU (scaled down: widths / 10)"
            what = f"{args.model} {size}², {steps} steps, {'compiled' if args.compile else 'eager'}"
            print_timed(f"{where}: {what}; {rounds} rounds, unprofiled", seconds, threads)
            profiled = {name: Profiled(on_gpu) for name in paths}
            for name, run in paths.items():
                run(around=profiled[name])
            diffq.drain()
        finally:
            diffq.close()
    rows = [{"path": name, **profile.summary()} for name, profile in profiled.items()]
    columns = ["path", "wall ms", "GPU busy ms", "GPU idle %", "host syncs", "to host"]
    print_table(
        "one run of each under torch.profiler",
        rows,
        [*columns, "gc 0/1/2", "gc ms"],
    )
    print_table(
        "operators, a job through diffq against bare (self CPU ms, and counts)",
        differences(rows[0]["ops"], rows[2]["ops"], args.top),
        ["operator", "bare count", "diffq count", "bare ms", "diffq ms", "+ms"],
    )
    if args.trace:
        args.trace.mkdir(parents=True, exist_ok=True)
        for name, profile in profiled.items():
            profile.profiler.export_chrome_trace(str(args.trace / f"{name.split()[-1]}.json"))


if __name__ == "__main__":
    main()
