"""Which device a worker process uses, and how GPUs are counted without importing torch."""

from __future__ import annotations

import os
import shutil
import subprocess


def count_gpus() -> int:
    """GPUs nvidia-smi can see (0 without a driver); the supervisor must not import torch."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def parse_gpus(spec: str | None) -> list[str]:
    """`--gpus 0,1` -> ["0", "1"]; `all` -> every GPU found; empty or `none` -> []."""
    if spec is None or spec.strip().lower() in ("", "none", "cpu"):
        return []
    if spec.strip().lower() == "all":
        return [str(i) for i in range(count_gpus())]
    ids = [part.strip() for part in spec.split(",") if part.strip()]
    if not all(part.isdigit() for part in ids):
        raise ValueError(f"--gpus takes comma-separated GPU indexes or 'all', got {spec!r}")
    return ids


def select_device(setting: str) -> str:
    """'auto' picks CUDA where a GPU is visible to this process, else CPU."""
    import torch

    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"DIFFQ_DEVICE={setting} but no CUDA device is visible")
    return setting


def configure_cpu_threads(processes_per_host: int = 1) -> None:
    """Split the cores between the worker processes on this host, unless OMP_NUM_THREADS
    says how many threads each may use (several workers on one CPU host)."""
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        return  # torch already follows it

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, (cores or 1) // max(1, processes_per_host)))
