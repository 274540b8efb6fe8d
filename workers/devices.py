"""Which device a worker process uses, and how GPUs are counted without importing torch."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

log = logging.getLogger(__name__)


class NoGpus(ValueError):
    """`--gpus all` on a host where nvidia-smi finds no GPU."""


def list_gpus() -> list[str]:
    """Indexes of the GPUs nvidia-smi lists; the supervisor must not import torch.

    Raises NoGpus when nvidia-smi is missing, fails, or lists none.
    """
    if shutil.which("nvidia-smi") is None:
        raise NoGpus(
            "--gpus all: nvidia-smi is not on the PATH (no NVIDIA driver?); "
            "use --gpus none to run on the CPU, or --gpus auto to fall back to it"
        )
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise NoGpus(f"--gpus all: nvidia-smi -L failed: {exc}") from exc
    ids = [str(i) for i, line in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]
    if not ids:
        raise NoGpus("--gpus all: nvidia-smi -L lists no GPU")
    return ids


def count_gpus() -> int:
    """GPUs nvidia-smi can see (0 without a driver or when it fails)."""
    try:
        return len(list_gpus())
    except NoGpus:
        return 0


def parse_gpus(spec: str | None) -> list[str]:
    """`--gpus 0,1` -> ["0", "1"]; `all` -> every GPU nvidia-smi lists (NoGpus if none);
    `auto` -> those, or [] (the CPU) where there are none; empty or `none` -> []."""
    if spec is None or spec.strip().lower() in ("", "none", "cpu"):
        return []
    if spec.strip().lower() == "all":
        return list_gpus()
    if spec.strip().lower() == "auto":
        found = count_gpus()
        if not found:
            log.warning("--gpus auto: no GPU found by nvidia-smi; running one worker on the CPU")
        return [str(i) for i in range(found)]
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
