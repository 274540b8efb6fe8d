"""Reproducibility manifests: what made a job's images, enough to make them again.

The weights' digest is computed once when a model loads (it reads every weight file);
each job adds only its seed and the scheduler it ran with.
"""

from __future__ import annotations

import hashlib
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".onnx", ".gguf", ".msgpack")
_CHUNK = 1 << 20


def weights_digest(model_dir: Path) -> str:
    """SHA-256 over the model's weight files: each one's path (relative) and bytes, in
    path order, so renaming or changing any weight changes the digest."""
    digest = hashlib.sha256()
    files = sorted(
        p for p in model_dir.rglob("*") if p.is_file() and p.suffix.lower() in WEIGHT_SUFFIXES
    )
    for path in files:
        digest.update(path.relative_to(model_dir).as_posix().encode() + b"\0")
        with path.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        index = int(device.partition(":")[2] or 0)
        return torch.cuda.get_device_name(index)
    return f"cpu ({platform.machine()})"


def model_manifest(name: str, digest: str, dtype: str, device: str) -> dict[str, Any]:
    """The part of every manifest that a loaded model fixes."""
    return {
        "model": name,
        "weights_sha256": digest,
        "dtype": dtype,
        "device": device_name(device),
        "versions": {
            "diffq": _version("diffq"),
            "diffusers": _version("diffusers"),
            "torch": _version("torch"),
            "transformers": _version("transformers"),
        },
    }


def job_manifest(base: dict[str, Any], scheduler: Any, seed: int) -> dict[str, Any]:
    config = {k: v for k, v in dict(scheduler.config).items()}
    return {
        **base,
        "scheduler": {"class": type(scheduler).__name__, "config": _plain(config)},
        "seed": seed,
    }


def _plain(value: Any) -> Any:
    """JSON-ready: tuples to lists, anything odd to its string."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
