"""Load each served model once per process, warm it up, and fail loudly when it can't."""

from __future__ import annotations

import importlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.addons.base import ByteCache
from app.addons.lora.worker import PipelineAdapters
from app.catalog import ModelSpec
from app.families import FAMILIES, family_of_pipeline
from workers import quantized
from workers.attention import AttentionRefused, apply_backend, resolved_backend
from workers.compiled import CompileRefused, compile_denoiser, compile_shapes
from workers.footprint import measured_bytes
from workers.manifest import files_digest, model_digest, model_manifest
from workers.tiers import TierUnavailable, check_tiers

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """A served model cannot be loaded; the worker must not start."""


@dataclass
class LoadedModel:
    spec: ModelSpec
    pipeline: Any
    device: str
    load_seconds: float  # from_pretrained: the weights read into memory
    device_seconds: float = 0.0  # moved to the device
    # SHA-256 of all that the loaded model fixes (workers/manifest.py `model_digest`: the
    # result cache keys on it), and the manifest fields the model fixes.
    digest: str = ""
    manifest: dict[str, Any] | None = None
    # The model's own scheduler as loaded: each call builds a new one from it.
    scheduler: Any = None
    # One pipeline call at a time on these weights (workers/call.py), and each job kind's
    # pipeline derived from them. Entries that share weights share these too.
    lock: threading.Lock = field(default_factory=threading.Lock)
    kind_pipelines: dict[str, Any] = field(default_factory=dict)
    # The LoRA adapters loaded into these weights (app/addons/lora/worker.py), shared
    # likewise.
    adapters: PipelineAdapters = field(default_factory=lambda: PipelineAdapters(8))
    # The ControlNets loaded beside these weights, by name, bounded in bytes
    # (app/addons/controlnet/worker.py); kind_pipelines keys (kind, *controlnets) for them.
    controlnets: ByteCache = field(default_factory=lambda: ByteCache(0))
    # Each scheduler name's pristine instance, copied for every call (workers/call.py).
    schedulers: dict[str, Any] = field(default_factory=dict)
    # What of the denoiser is compiled in place for the catalog's compile_sizes
    # (workers/compiled.py): "model" (all of it) or "blocks" (its repeated blocks); "":
    # nothing, every size runs eager.
    compiled: str = ""
    # Seconds the warm-up took: "warm_up" (the first kind), "warm_up WxH" per compile tier.
    warm_seconds: dict[str, float] = field(default_factory=dict)
    # Bytes of its weights on the device (workers/footprint.py), for the model cache.
    bytes: int = 0

    @property
    def reload_seconds(self) -> float:
        """What loading these weights again would cost: read, moved, warmed up."""
        return self.load_seconds + self.device_seconds + sum(self.warm_seconds.values())

    def __post_init__(self) -> None:
        if self.scheduler is None:
            self.scheduler = getattr(self.pipeline, "scheduler", None)


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
    pipeline_class = str(components.get("_class_name") or "")
    found = family_of_pipeline(pipeline_class)
    if found != spec.family:
        # The API offers the schedulers and sizes of the catalog's family: a model of
        # another family would fail the jobs it accepted.
        raise ModelLoadError(
            f"model {spec.name!r}: {pipeline_class} is a {FAMILIES[found].summary} "
            f'pipeline; set family = "{found}" in its catalog table (it says {spec.family!r})'
        )


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


def model_identity(
    spec: ModelSpec, device: str, digest_cache: Path | None = None
) -> tuple[str, dict[str, Any]]:
    """The model's digest (what the result cache keys on) and the manifest fields it
    fixes, from its files and loading keys: known without loading it. `digest_cache`:
    where the folders' digests are kept between starts (workers/manifest.py)."""
    dtype = resolve_dtype(spec, device)
    dtype_name = str(dtype).removeprefix("torch.")
    backend = resolved_backend(spec, device, dtype)
    try:
        quantized.check(spec, device)
    except quantized.QuantizationRefused as exc:
        raise ModelLoadError(f"model {spec.name!r}: {exc}") from exc
    digests: dict[str, str | None] = {
        "weights": files_digest(spec.path, digest_cache),
        "vae": (files_digest(spec.vae_path, digest_cache) if spec.vae_path is not None else None),
    }
    digests["model"] = digest = model_digest(
        digests["weights"],
        vae_sha=digests["vae"],
        dtype=dtype_name,
        variant=spec.variant,
        safety_checker=spec.safety_checker,
        attention=backend,
        quantize=spec.quantize,
    )
    manifest = model_manifest(
        spec.name,
        digests,
        dtype_name,
        device,
        variant=spec.variant,
        safety_checker=spec.safety_checker,
        attention_backend=backend,
        quantize=spec.quantize,
    )
    return digest, manifest


def load_model(spec: ModelSpec, device: str, digest_cache: Path | None = None) -> LoadedModel:
    import transformers
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    check_model_dir(spec)
    dtype = resolve_dtype(spec, device)
    digest, manifest = model_identity(spec, device, digest_cache)  # refuses what cannot run
    started = time.perf_counter()
    try:
        options = {**load_options(spec, dtype), **quantized.load_options(spec)}
        pipeline = DiffusionPipeline.from_pretrained(str(spec.path), **options)
        read = time.perf_counter()
        pipeline = pipeline.to(device)
        backend = resolved_backend(spec, device, dtype)
        apply_backend(pipeline, backend)
        check_tiers(pipeline, spec.tiers)
    except TierUnavailable as exc:
        raise ModelLoadError(f"model {spec.name!r}: {exc}") from exc
    except AttentionRefused as exc:
        raise ModelLoadError(
            f"model {spec.name!r}: attention_backend {backend!r} cannot run on this worker "
            f"({device}): {exc}"
        ) from exc
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"model {spec.name!r} failed to load from {spec.path}: {exc}") from exc
    pipeline.set_progress_bar_config(disable=True)
    loaded_seconds = time.perf_counter() - started
    device_seconds = time.perf_counter() - read
    log.info("model %s sha256 %s", spec.name, digest[:16])
    from app.metrics.instruments import MODEL_LOAD_DURATION

    MODEL_LOAD_DURATION.labels(spec.name, "load").observe(loaded_seconds)
    model = LoadedModel(
        spec, pipeline, device, loaded_seconds - device_seconds, device_seconds, digest, manifest
    )
    model.bytes = measured_bytes(pipeline)
    try:
        compile_denoiser(model)
    except CompileRefused as exc:
        raise ModelLoadError(f"model {spec.name!r}: compile_scope: {exc}") from exc
    return model


def warm_up(model: LoadedModel) -> float:
    """One short job through the worker's own pipeline call (workers/call.py), so the
    first real job does not pay for kernel selection, allocation or deriving its kind's
    pipeline."""
    from dataclasses import replace

    from app.kinds import get_kind
    from workers.call import generate

    started = time.perf_counter()
    # The first kind the model offers (an inpainting model's warms up inpainting).
    kind = get_kind(model.spec.kinds[0])
    request, inputs = kind.warm_up(model.spec)
    generate(model, [request], on_step=[lambda *_: True], inputs=[inputs])
    model.warm_seconds["warm_up"] = time.perf_counter() - started
    for width, height in model.spec.compile_tiers:  # each tier compiled here, not on a job
        tier_started = time.perf_counter()
        for shaped in compile_shapes(model.spec, replace(request, width=width, height=height)):
            generate(model, [shaped], on_step=[lambda *_: True], inputs=[inputs])
        model.warm_seconds[f"warm_up {width}x{height}"] = time.perf_counter() - tier_started
    seconds = time.perf_counter() - started
    from app.metrics.instruments import MODEL_LOAD_DURATION

    MODEL_LOAD_DURATION.labels(model.spec.name, "warm_up").observe(seconds)
    return seconds
