"""Quantized weights (the catalog's `quantize`): the denoiser's weights stored in 8 bits,
weight-only, computed in the model's dtype. `int8` halves fp16 weights' memory (a
quarter of fp32's) and runs on any device; `fp8` does the same in float8 and needs a CUDA
GPU of compute capability 8.9 or later (Ada, Hopper), where its kernels exist: a worker
on anything else refuses to start, naming the model and the reason, before any job is
taken. The text encoders and the VAE keep the model's dtype (they run once a job).

The backend is optimum-quanto, through diffusers' quantization config: it is imported
only by a process that loads a quantized model, and it runs on the CPU too (the tests).
torchao, the backend diffusers now recommends, is left out: installed, it is imported by
every process that imports diffusers (docs/decisions.md 39). This module is the one
place that names the backend.

What is quantized is in the model's digest (the result cache's key) and in every job's
manifest (`quantize`), so a quantized model's results never answer for the full
precision model's.
"""

from __future__ import annotations

import json
import warnings
from importlib import util
from typing import Any

from app.catalog import ModelSpec

# The catalog's value -> optimum-quanto's weights dtype.
WEIGHTS = {"int8": "int8", "fp8": "float8"}
FP8_CAPABILITY = (8, 9)
PACKAGE = "optimum.quanto"


class QuantizationRefused(RuntimeError):
    """The model's quantization cannot run on this worker."""


def check(spec: ModelSpec, device: str) -> None:
    """Raise QuantizationRefused where `spec.quantize` cannot run on `device`. Reads the
    GPU's capability, so it runs in the process that owns the device (never in a worker's
    forking parent)."""
    if not spec.quantize:
        return
    if util.find_spec(PACKAGE.split(".")[0]) is None or util.find_spec(PACKAGE) is None:
        raise QuantizationRefused(
            f'quantize = "{spec.quantize}" needs optimum-quanto, which is not installed here '
            "(pip install 'diffq[worker]')"
        )
    if spec.quantize != "fp8":
        return
    if not device.startswith("cuda"):
        raise QuantizationRefused(
            'quantize = "fp8" needs a CUDA GPU of compute capability 8.9 or later (Ada, '
            f'Hopper); this worker runs on {device}: use quantize = "int8" or none'
        )
    import torch

    capability = torch.cuda.get_device_capability(torch.device(device))
    if capability < FP8_CAPABILITY:
        name = torch.cuda.get_device_name(torch.device(device))
        raise QuantizationRefused(
            f'quantize = "fp8" needs compute capability 8.9 or later (Ada, Hopper); '
            f'{name} has {capability[0]}.{capability[1]}: use quantize = "int8"'
        )


def denoiser_component(spec: ModelSpec) -> str:
    """The pipeline's denoiser as its model_index.json names it (`unet` or `transformer`)."""
    components = json.loads((spec.path / "model_index.json").read_text())
    return "unet" if "unet" in components else "transformer"


def load_options(spec: ModelSpec) -> dict[str, Any]:
    """from_pretrained's keywords that quantize the denoiser as it loads (none without)."""
    if not spec.quantize:
        return {}
    from diffusers import PipelineQuantizationConfig, QuantoConfig

    with warnings.catch_warnings():  # diffusers marks its quanto backend for removal in 1.0
        warnings.simplefilter("ignore", FutureWarning)
        config = QuantoConfig(weights_dtype=WEIGHTS[spec.quantize])
    mapping = {denoiser_component(spec): config}
    return {"quantization_config": PipelineQuantizationConfig(quant_mapping=mapping)}
