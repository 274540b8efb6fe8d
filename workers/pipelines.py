"""Load each served model once per process, warm it up, and fail loudly when it can't."""

from __future__ import annotations

import importlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from app.catalog import ModelSpec
from workers.manifest import model_manifest, weights_digest

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """A served model cannot be loaded; the worker must not start."""


@dataclass
class LoadedModel:
    spec: ModelSpec
    pipeline: Any
    device: str
    load_seconds: float
    # SHA-256 of the weight files and the manifest fields the model fixes (workers/manifest.py).
    digest: str = ""
    manifest: dict[str, Any] | None = None


def check_model_dir(spec: ModelSpec) -> None:
    """Cheap structural check (no weights read), done before any process forks."""
    index = spec.path / "model_index.json"
    if not spec.path.is_dir():
        raise ModelLoadError(f"model {spec.name!r}: {spec.path} is not a directory")
    try:
        components = json.loads(index.read_text())
    except FileNotFoundError as exc:
        raise ModelLoadError(
            f"model {spec.name!r}: {index} is missing; is this a diffusers directory?"
        ) from exc
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"model {spec.name!r}: {index} is not JSON: {exc}") from exc
    missing = [
        name
        for name, value in components.items()
        if not name.startswith("_")
        and isinstance(value, list)
        and value[0] is not None
        and not (spec.path / name).is_dir()
    ]
    if missing:
        raise ModelLoadError(f"model {spec.name!r}: component folders missing: {missing}")


def preimport_components(spec: ModelSpec) -> None:
    """Import the classes a model's pipeline is built from (per model_index.json).

    Done in the worker's main process before forking, so that a pool process replacing a
    crashed one does not spend seconds importing them again.
    """
    components = json.loads((spec.path / "model_index.json").read_text())
    names = [("diffusers", components.get("_class_name"))]
    names += [tuple(v) for v in components.values() if isinstance(v, list) and len(v) == 2]
    for library, class_name in names:
        if library in ("diffusers", "transformers") and class_name:
            getattr(importlib.import_module(library), class_name, None)


def device_name(device: str) -> str:
    """What usage and prices call the device: the GPU's product name, or "cpu"."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return device.split(":")[0]


def resolve_dtype(spec: ModelSpec, device: str):
    """The torch dtype to load with; bf16 is refused where the GPU lacks it."""
    import torch

    dtype = getattr(torch, spec.dtype)
    if device == "cpu" and dtype != torch.float32:
        # Half precision on CPU is slow or unsupported for several ops.
        log.warning("model %s: %s on CPU is not supported; using float32", spec.name, spec.dtype)
        return torch.float32
    gpu = device.startswith("cuda")
    if dtype == torch.bfloat16 and gpu and not torch.cuda.is_bf16_supported(False):
        name = torch.cuda.get_device_name(device)
        raise ModelLoadError(
            f"model {spec.name!r}: dtype bfloat16 needs a GPU with native bf16 "
            f'(Ampere or newer); {name} lacks it: use dtype = "float16"'
        )
    return dtype


def load_options(spec: ModelSpec, dtype) -> dict[str, Any]:
    """from_pretrained's keywords for the catalog's loading keys."""
    options: dict[str, Any] = {"dtype": dtype, "local_files_only": True}
    if spec.variant:
        options["variant"] = spec.variant  # unet/diffusion_pytorch_model.fp16.safetensors
    components = json.loads((spec.path / "model_index.json").read_text())
    if "safety_checker" in components and not spec.safety_checker:
        options["safety_checker"] = None
        options["requires_safety_checker"] = False
    if spec.vae_path is not None:
        from diffusers import AutoencoderKL

        if not (spec.vae_path / "config.json").is_file():
            raise ModelLoadError(
                f"model {spec.name!r}: vae_path {spec.vae_path} has no config.json"
            )
        vae_variant = spec.variant if _has_variant(spec.vae_path, spec.variant) else None
        options["vae"] = AutoencoderKL.from_pretrained(
            str(spec.vae_path), dtype=dtype, local_files_only=True, variant=vae_variant
        )
    return options


def _has_variant(folder, variant: str | None) -> bool:
    return bool(variant) and any(folder.glob(f"*.{variant}.safetensors"))


def load_model(spec: ModelSpec, device: str) -> LoadedModel:
    import transformers
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    check_model_dir(spec)
    dtype = resolve_dtype(spec, device)
    started = time.perf_counter()
    try:
        pipeline = DiffusionPipeline.from_pretrained(str(spec.path), **load_options(spec, dtype))
        pipeline = pipeline.to(device)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"model {spec.name!r} failed to load from {spec.path}: {exc}") from exc
    pipeline.set_progress_bar_config(disable=True)
    loaded_seconds = time.perf_counter() - started
    digest = weights_digest(spec.path)
    log.info(
        "model %s weights sha256 %s (%.2fs)",
        spec.name,
        digest[:16],
        time.perf_counter() - started - loaded_seconds,
    )
    manifest = model_manifest(spec.name, digest, str(dtype).removeprefix("torch."), device)
    return LoadedModel(spec, pipeline, device, loaded_seconds, digest, manifest)


def warm_up(model: LoadedModel) -> float:
    """One short run so the first job does not pay for kernel selection and allocation."""
    import torch

    started = time.perf_counter()
    spec = model.spec
    with torch.inference_mode():
        model.pipeline(
            "warm-up",
            num_inference_steps=1,
            width=spec.min_size,
            height=spec.min_size,
            guidance_scale=spec.default_guidance,
            generator=torch.Generator(device=model.device).manual_seed(0),
        )
    return time.perf_counter() - started
