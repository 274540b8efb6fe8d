"""Every GPU check in one command, one markdown report (scripts/gpu-check).

    scripts/gpu-check --prepare [--python-version 3.11]   # here: the wheels that travel
    scripts/gpu-check [--report gpu-report.md]            # there: on the GPU machine
    scripts/gpu-check --dry-run [--report PATH]           # anywhere: CPU, scaled down

A GPU machine has torch, accelerate, transformers, safetensors and Pillow, no package
registry, and at most 10 minutes a command. `--prepare` downloads, as wheels with
`pip download --no-deps`, every distribution diffq's worker runs on (diffq with its
`worker` extra, and pytest, at the versions installed here) that those five do not
already bring, into
`.gpu-wheels/` (git-ignored). On the GPU machine the run installs them with
`pip install --no-index --find-links` into `.gpu-site/` (git-ignored; put first on the
path of every step, the image's own packages untouched), then runs, each step with its
own time limit inside the budget (`--budget`, 540 s by default):

1. `tests/gpu` (pytest; a CPU skips them with the reason);
2. `bench.quality` on FLUX.1-dev's layout (random weights drawn on the GPU in bf16), 1024²,
   28 steps: the bare pipeline call, then each quality tier through the worker's call
   (seconds an image, % of bare, PSNR against `exact`), eager;
3. `bench.quality`: each quality tier of SD 1.5 512² and SDXL 1024² against `exact` in
   the same run (denoiser work, seconds an image, PSNR), fp16, 20 steps;
4. `bench.step_profile`: SDXL jobs through diffq against the bare call and the worker's
   call alone, then each under torch.profiler (GPU idle, host syncs, garbage
   collections, each thread's CPU, operators);
5. `bench.quantized`: SD 1.5 512² with int8 and fp8 weights against none (memory,
   seconds a call, PSNR);
6. the FLUX rows again, compiled as its catalog entry would (`compile_scope` auto: its
   blocks, inductor), warmed as a worker warms it;
7. `bench.gpu`: SD 1.5 512² (eager and compiled), then SDXL 1024² (eager), fp16, 20
   steps (random weights in the published layouts: no weights travel);
8. `bench.cold_start`: SD 1.5 and SDXL, process start to first job ready, by phase;
9. `bench.batching` on SD 1.5;
10. `bench.duty --jobs 100` at 0.5 s and 2 s (diffq's worker on the embedded stores, its
    synthetic model).

The report holds each step's command, status, seconds and its tables (the output's last
lines). A step that fails or runs out of time is reported as such and the next one runs.
`--dry-run` runs the same steps on the CPU with scaled-down sizes and few steps, and
installs nothing: tests/unit/test_gpu_check.py runs it so the command does not rot.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".gpu-wheels"
SITE = ROOT / ".gpu-site"
# What the GPU image brings: these and everything they depend on are not shipped
# (OpenCV, 56 MiB, serves ControlNet's canny and is in the image too).
IMAGE_HAS = (
    "torch",
    "accelerate",
    "transformers",
    "safetensors",
    "pillow",
    "opencv-python-headless",
)
# Left behind to keep what travels to the GPU machine under 64 MiB: scipy (35 MiB) serves only
# the `lms` scheduler, PyAV (36 MiB) only video's encoding, neither of which the GPU checks
# run; Swagger UI only the API's /docs.
NOT_SHIPPED = ("scipy", "swagger-ui-bundle", "av")
TAIL_LINES = 60


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(roots: dict[str, set[str]]) -> dict[str, str]:
    """Installed distributions reachable from `roots` (name -> extras): name -> version."""
    from packaging.requirements import Requirement

    found: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = list(roots.items())
    while todo:
        name, extras = todo.pop()
        if (name, frozenset(extras)) in seen:
            continue
        seen.add((name, frozenset(extras)))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # not installed here: a marker for another platform
        found[_canonical(dist.metadata["Name"])] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker and not any(
                req.marker.evaluate({"extra": extra}) for extra in (extras or {""})
            ):
                continue
            todo.append((_canonical(req.name), set(req.extras)))
    return found


def shipped() -> dict[str, str]:
    """The distributions the GPU machine lacks: name -> version, as installed here."""
    ours = _closure({"diffq": {"worker"}, "pytest": set()})
    image = _closure({name: set() for name in IMAGE_HAS})
    left = {*image, *NOT_SHIPPED, "diffq"}
    return {n: v for n, v in sorted(ours.items()) if n not in left}


def prepare(python_version: str) -> int:
    """Download the wheels into .gpu-wheels/ (binary ones for Linux x86-64, this Python)."""
    WHEELS.mkdir(exist_ok=True)
    wanted = shipped()
    for old in WHEELS.glob("*.whl"):  # only what this environment asks for travels
        if _canonical(old.name.split("-")[0]) not in wanted:
            old.unlink()
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(WHEELS)]
    binary = [
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        *[
            arg
            for tag in ("manylinux2014_x86_64", "manylinux_2_28_x86_64", "linux_x86_64")
            for arg in ("--platform", tag)
        ],
    ]
    failed = []
    for name, version in wanted.items():
        done = subprocess.run([*base, *binary, f"{name}=={version}"], capture_output=True)
        if done.returncode:
            failed.append(f"{name}=={version}: {done.stderr.decode()[-300:]}")
    size = sum(p.stat().st_size for p in WHEELS.glob("*.whl")) / 2**20
    print(f"{len(wanted) - len(failed)} of {len(wanted)} wheels in {WHEELS} ({size:.1f} MiB)")
    for line in failed:
        print("not downloaded:", line, file=sys.stderr)
    return 1 if failed else 0


def install() -> str:
    """The wheels installed into .gpu-site/ with no index; what pip said."""
    wheels = sorted(str(p) for p in WHEELS.glob("*.whl"))
    if not wheels:
        return f"no wheels in {WHEELS}: run `scripts/gpu-check --prepare` where pip has a registry"
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps"]
    command += ["--find-links", str(WHEELS), "--target", str(SITE), "--upgrade", *wheels]
    done = subprocess.run(command, capture_output=True, text=True)
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    return f"pip install: exit {done.returncode}; " + " / ".join(tail)


@dataclass
class Step:
    title: str
    args: list[str]
    limit: float
    status: str = "not run"
    seconds: float = 0.0
    output: str = ""
    process: subprocess.Popen | None = field(default=None, repr=False)


def _module(command: str) -> list[str]:
    """`python -m` and the command's words."""
    return [sys.executable, "-m", *command.split()]


TESTS = "pytest -p no:cacheprovider -q -rs tests/gpu"


def steps(dry_run: bool) -> list[Step]:
    if dry_run:
        return [
            Step("tests/gpu", _module(TESTS), 95),
            Step(
                "bench.quality (tiny)",
                _module("bench.quality --models sd flux --seeds 1 --steps 4 --sweep 0.5"),
                120,
            ),
            Step("bench.step_profile (scaled down)", _module("bench.step_profile --steps 2"), 120),
            Step("bench.quantized (tiny)", _module("bench.quantized --rounds 1 --steps 2"), 120),
            Step(
                "bench.quality: FLUX.1-dev's layout (scaled down), eager and compiled",
                _module("bench.quality --models flux-dev --seeds 1 --steps 2 --sweep --compile"),
                200,
            ),
            Step(
                "bench.gpu (scaled down)",
                _module("bench.gpu --models sd15 --images 1 --steps 1"),
                300,
            ),
            Step(
                "bench.cold_start (tiny)", _module("bench.cold_start --models tiny --runs 1"), 200
            ),
            Step(
                "bench.batching (tiny)",
                _module(
                    "bench.batching --model tiny --jobs 4 --steps 1 --batches 1 2 --rounds 1 "
                    "--load 1"
                ),
                200,
            ),
            Step(
                "bench.duty (embedded)",
                _module("bench.duty --embedded --jobs 3 --seconds 0.01 --size 64 --modes diffq"),
                200,
            ),
        ]
    # In order of what matters most; each limit is a cap, the budget cuts the last ones
    # (the quality tiers and where an SDXL job loses time against the bare call first: SD
    # 1.5's call was at 98.6 % of bare on 2026-11-30, SDXL's rows at 73 %; then quantized
    # weights, never measured on a GPU; then the bare-against-diffq rows; cold start,
    # batching and duty, measured on 2026-11-28, get what the steps before them leave,
    # and one left no time is reported as not run). The
    # limits are what each step took on an NVIDIA H200 on 2026-11-28 and 2026-11-30
    # (docs/performance.md), plus a margin. Every step runs alone: the SDXL rows of
    # 2026-11-28 disagreed with each other while bench.duty ran beside them. SDXL's compile
    # (minutes) is left to `bench.gpu --compile` alone.
    return [
        Step("tests/gpu", _module(TESTS), 95),
        Step(
            "bench.quality: FLUX.1-dev 1024², bf16, 28 steps, bare and each tier, eager",
            _module("bench.quality --models flux-dev --seeds 1 --steps 28 --sweep"),
            120,
        ),
        Step(
            "bench.quality: SD 1.5 512² and SDXL 1024², fp16, 20 steps, each tier vs exact",
            _module("bench.quality --models sd15 sdxl --seeds 2 --steps 20"),
            80,
        ),
        Step(
            "bench.step_profile: SDXL 1024², fp16, 20 steps, a job through diffq vs the bare call",
            _module("bench.step_profile --model sdxl --steps 20 --rounds 3"),
            140,
        ),
        Step(
            "bench.quantized: SD 1.5 512², fp16, 20 steps, none, int8 and fp8 weights",
            _module("bench.quantized --model sd15 --rounds 5"),
            70,
        ),
        Step(
            "bench.quality: FLUX.1-dev 1024², bf16, 28 steps, compiled (its blocks, inductor)",
            _module("bench.quality --models flux-dev --seeds 1 --steps 28 --sweep --compile"),
            300,
        ),
        Step(
            "bench.gpu: SD 1.5 512², fp16, 20 steps, eager and compiled",
            _module("bench.gpu --models sd15 --steps 20 --images 8 --compile"),
            120,
        ),
        Step(
            "bench.gpu: SDXL 1024², fp16, 20 steps, eager",
            _module("bench.gpu --models sdxl --steps 20 --images 6"),
            95,
        ),
        Step(
            "bench.cold_start: SD 1.5 and SDXL (goal: SDXL fp16 from disk in 20 s)",
            _module("bench.cold_start --models sd15 sdxl --runs 1"),
            130,
        ),
        Step(
            "bench.batching: SD 1.5 512²",
            _module(
                "bench.batching --model sd15 --steps 20 --jobs 12 --batches 1 4 --rounds 1 --load 2"
            ),
            70,
        ),
        Step(
            "bench.duty --jobs 100, 0.5 s and 2 s (embedded stores, the synthetic model)",
            _module("bench.duty --embedded --jobs 100 --seconds 0.5 2 --modes diffq"),
            420,
        ),
    ]


def _start(step: Step, env: dict[str, str]) -> None:
    step.process = subprocess.Popen(
        step.args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(step: Step, started: float, limit: float) -> None:
    assert step.process is not None
    try:
        out, _ = step.process.communicate(timeout=max(1.0, limit))
        code = step.process.returncode
        if code == 0:
            step.status = "passed"
        elif code == 5 and "skipped" in (out or ""):  # pytest: every test skipped at collection
            step.status = "skipped (the reason is in its output)"
        else:
            step.status = f"failed (exit {code})"
    except subprocess.TimeoutExpired:
        os.killpg(step.process.pid, 9)
        out, _ = step.process.communicate()
        step.status = f"stopped at its limit ({limit:.0f} s)"
    step.seconds = time.monotonic() - started
    step.output = "\n".join((out or "").rstrip().splitlines()[-TAIL_LINES:])


def run(dry_run: bool, report: Path, budget: float) -> int:
    import torch

    gpu = torch.cuda.is_available()
    began = time.monotonic()
    notes = [f"python {platform.python_version()}, torch {torch.__version__}"]
    if gpu:
        notes.append(f"GPU: {torch.cuda.get_device_name(0)}")
    else:
        notes.append("no CUDA device: " + ("a dry run, CPU, scaled down" if dry_run else "CPU"))
    if not dry_run and WHEELS.is_dir():
        notes.append(install())
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(SITE), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    env.setdefault("OMP_NUM_THREADS", "1" if not gpu else env.get("OMP_NUM_THREADS", "8"))
    for key in ("DIFFQ_DATABASE_URL", "DIFFQ_BROKER_URL", "DIFFQ_STORAGE_URL", "DIFFQ_MODELS_FILE"):
        env.pop(key, None)
    plan = steps(dry_run)
    report.parent.mkdir(parents=True, exist_ok=True)
    for step in plan:
        left = budget - (time.monotonic() - began)
        if left < 5:
            step.status = "not run: the budget was spent"
            continue
        started = time.monotonic()
        _start(step, env)
        _finish(step, started, min(step.limit, left))
        # written after each step: a run stopped from outside keeps what it measured
        report.write_text(_markdown(plan, notes, time.monotonic() - began, dry_run))
    report.write_text(_markdown(plan, notes, time.monotonic() - began, dry_run))
    print(f"report: {report}")
    return 0 if all(s.status.startswith(("passed", "skipped")) for s in plan) else 1


def _markdown(plan: list[Step], notes: list[str], seconds: float, dry_run: bool) -> str:
    title = "diffq GPU check" + (" (dry run: CPU, scaled down)" if dry_run else "")
    lines = [f"# {title}", "", *[f"- {n}" for n in notes], f"- {seconds:.0f} s in all", ""]
    lines += ["| step | status | seconds |", "|---|---|---|"]
    lines += [f"| {s.title} | {s.status} | {s.seconds:.1f} |" for s in plan]
    for step in plan:
        lines += ["", f"## {step.title}", "", f"`{' '.join(step.args[2:])}`: {step.status}", ""]
        lines += ["```", step.output or "(no output)", "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", action="store_true", help="download the wheels (here)")
    parser.add_argument("--dry-run", action="store_true", help="CPU, scaled down, no install")
    parser.add_argument("--report", type=Path, default=ROOT / "gpu-report.md")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for all steps")
    parser.add_argument(
        "--python-version",
        default=f"{sys.version_info.major}.{sys.version_info.minor}",
        help="the GPU machine's Python (for --prepare's binary wheels)",
    )
    args = parser.parse_args()
    if args.prepare:
        return prepare(args.python_version)
    return run(args.dry_run, args.report, args.budget)


if __name__ == "__main__":
    sys.exit(main())
