"""How many bytes a model's weights take on its device: estimated from its files before
it is loaded (so that room is made first, not after an out-of-memory error), and
measured once it is loaded. The worker's model cache keeps the loaded models within a
bound in these bytes (workers/models.py)."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path
from typing import Any

from app.catalog import ModelSpec

log = logging.getLogger(__name__)

# Bytes per element of each safetensors dtype.
_SIZES = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip
_FLOATS = {"F64", "F32", "F16", "BF16"}
_HEADER_MAX = 100 * 1024 * 1024


def _header(path: Path) -> dict[str, Any]:
    """A safetensors file's header: each tensor's dtype and shape (the weights unread)."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        if length > _HEADER_MAX:
            raise ValueError(f"{path}: header of {length} bytes")
        return json.loads(file.read(length))


def _files(folder: Path, variant: str | None) -> list[Path]:
    """The weight files from_pretrained reads in a component folder: the variant's
    where it has them, else the plain ones."""
    every = sorted(folder.glob("*.safetensors"))
    if variant:
        chosen = [p for p in every if f".{variant}." in p.name]
        if chosen:
            return chosen
    return [p for p in every if p.name.count(".") == 1]


def estimate_bytes(spec: ModelSpec, element_size: int) -> int:
    """The model's weights at `element_size` bytes per floating-point element (the dtype
    it loads in), from its safetensors headers; a folder without them (a `.bin` only
    model) counts its files' size. 0 when the directory cannot be read."""
    folders = []
    try:
        components = json.loads((spec.path / "model_index.json").read_text())
    except (OSError, ValueError):
        return 0
    for name, value in components.items():
        if name.startswith("_") or not isinstance(value, list) or value[0] is None:
            continue
        if name == "vae" and spec.vae_path is not None:
            folders.append(spec.vae_path)
        else:
            folders.append(spec.path / name)
    total = 0
    for folder in folders:
        files = _files(folder, spec.variant) if folder.is_dir() else []
        if not files:
            total += sum(p.stat().st_size for p in folder.glob("*.bin")) if folder.is_dir() else 0
            continue
        for path in files:
            try:
                header = _header(path)
            except (OSError, ValueError, struct.error) as exc:
                log.info("no estimate from %s (%s): its size counts", path, exc)
                total += path.stat().st_size
                continue
            for key, info in header.items():
                if key == "__metadata__":
                    continue
                count = 1
                for dim in info["shape"]:
                    count *= dim
                dtype = info["dtype"]
                total += count * (element_size if dtype in _FLOATS else _SIZES.get(dtype, 4))
    return total


def measured_bytes(pipeline: Any) -> int:
    """The bytes of a loaded pipeline's parameters and buffers (each tensor once)."""
    import torch

    seen: set[int] = set()
    total = 0
    for component in getattr(pipeline, "components", {}).values():
        if not isinstance(component, torch.nn.Module):
            continue
        for tensor in [*component.parameters(), *component.buffers()]:
            if tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def device_budget(device: str, configured: int) -> int:
    """The bytes a worker's loaded models may take: DIFFQ_WORKER_MODEL_BYTES where set;
    on a GPU, 70 % of its memory (the rest for activations, the VAE's decode and
    adapters); on the CPU, no bound (0)."""
    if configured > 0:
        return configured
    if not device.startswith("cuda"):
        return 0
    import torch

    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory * 0.7)
