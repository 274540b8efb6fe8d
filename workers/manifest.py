"""Reproducibility manifests and the model's digest: what made a job's images, enough to
make them again, and what the result cache keys on.

The digests are computed once when a model loads (they read every file of the model's
folder and of a separate VAE's); each job adds only its seed and the scheduler it ran
with. A folder's digest is kept under DIFFQ_HOME/digests, keyed by each file's path,
size, inode, and modification and change times (as git's index judges a file unchanged:
the change time is set by the kernel on every write, and no copy or unpacking can set it
back), so a worker's later starts do not read the weights a second time (6.1 s of SDXL's
29.3 s cold start). A file changed in any of those is read again.

The model's digest covers everything a loaded model fixes that shapes an image:
the folder's files (weights and configurations: a changed scheduler_config.json is a
different model), a separate VAE's files, the dtype it runs in, the weights' variant and
whether the safety checker runs (app/jobs/cache.py keys on it).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def _shapes_images(path: Path, folder: Path) -> bool:
    """A file that loading reads: everything but hidden files and documentation."""
    parts = path.relative_to(folder).parts
    return not any(part.startswith(".") for part in parts) and path.suffix.lower() != ".md"


def files_digest(folder: Path, cache: Path | None = None) -> str:
    """SHA-256 over a model folder's files (weights, configurations, tokenizers): each
    one's path (relative) and bytes, in path order, so renaming or changing any of them
    changes the digest. `cache`: a folder where it is kept by the files' stat (above)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and _shapes_images(p, folder))
    if cache is None:
        return _read_digest(folder, files)
    stat = hashlib.sha256(str(folder.resolve()).encode() + b"\0")
    for path in files:
        st = path.stat()
        name = path.relative_to(folder).as_posix()
        kept_by = (name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        stat.update("\0".join(map(str, kept_by)).encode() + b"\0")
    kept = cache / f"{stat.hexdigest()}.sha256"
    with contextlib.suppress(OSError):
        value = kept.read_text().strip()
        if len(value) == 64:
            return value
    value = _read_digest(folder, files)
    with contextlib.suppress(OSError):  # a cache that cannot be written is read each time
        cache.mkdir(parents=True, exist_ok=True)
        part = kept.with_suffix(f".{os.getpid()}.part")
        part.write_text(value)
        os.replace(part, kept)
    return value


def _read_digest(folder: Path, files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        with path.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def model_digest(
    files_sha: str,
    *,
    vae_sha: str | None,
    dtype: str,
    variant: str | None,
    safety_checker: bool,
    attention: str = "native",
    quantize: str = "",
) -> str:
    """SHA-256 over everything a loaded model fixes that shapes its images (an attention
    backend other than PyTorch's SDPA too: its kernels round otherwise; quantized
    weights)."""
    fixed = {
        "files": files_sha,
        "vae": vae_sha,
        "dtype": dtype,
        "variant": variant,
        "safety_checker": safety_checker,
    }
    if attention != "native":  # the digests of every model before backends, unchanged
        fixed["attention"] = attention
    if quantize:
        fixed["quantize"] = quantize
    return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()


@functools.cache
def package_version(package: str) -> str | None:
    """An installed distribution's version, read once a process (importlib.metadata scans
    every distribution's folder: about 1 ms a name, paid by each job's manifest and
    checkpoints before this was kept)."""
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


def model_manifest(
    name: str,
    digests: dict[str, str | None],
    dtype: str,
    device: str,
    *,
    variant: str | None = None,
    safety_checker: bool = False,
    attention_backend: str = "native",
    quantize: str = "",
) -> dict[str, Any]:
    """The part of every manifest that a loaded model fixes. `digests`: `model` (the
    cache's key: `model_digest`), `weights` (the folder's files), `vae` (a separate
    VAE's files, or None)."""
    return {
        "model": name,
        "model_sha256": digests["model"],
        "weights_sha256": digests["weights"],
        "vae_sha256": digests.get("vae"),
        "dtype": dtype,
        "variant": variant,
        "safety_checker": safety_checker,
        "attention_backend": attention_backend,
        "quantize": quantize or None,
        "device": device_name(device),
        "versions": {
            "diffq": package_version("diffq"),
            "diffusers": package_version("diffusers"),
            "torch": package_version("torch"),
            "transformers": package_version("transformers"),
        },
    }


def job_manifest(base: dict[str, Any], scheduler: Any, request: Any) -> dict[str, Any]:
    """A job's manifest: the model's part, its kind and input images' digests, the
    scheduler it ran with, its seed, and its add-ons (app/addons: its adapters and
    controls, as the row keeps them)."""
    from app.addons import ADDONS
    from app.kinds import kind_of

    config = {k: v for k, v in dict(scheduler.config).items()}
    return {
        **base,
        "kind": request.kind,
        "inputs": kind_of(request).inputs(request),
        "scheduler": {"class": type(scheduler).__name__, "config": _plain(config)},
        "seed": request.seed,
        **{
            name: addon.stored(getattr(request, name))
            for name, addon in ADDONS.items()
            if getattr(request, name)
        },
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
