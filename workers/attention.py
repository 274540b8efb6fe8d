"""Which attention kernels a model's denoiser runs (the catalog's `attention_backend`).

A transformer whose attention goes through diffusers' dispatcher (app/families.py
`attention_dispatch`: FLUX, Wan, LTX-Video) can run FlashAttention 3, SageAttention, flex
attention or one of PyTorch's SDPA kernels; "auto" picks FlashAttention 3 where its
package is installed on a CUDA GPU and the model runs in half precision, else PyTorch's
SDPA ("native", which chooses its own flash or memory-efficient kernel). A UNet's and
SD3's processors call SDPA themselves: "native".

The backend is set on each such model's own attention modules, "native" included, so a
backend one model asks for never reaches another's through diffusers' process-wide
default. One the worker cannot run (its package missing, no GPU) stops the worker at
start, naming the model and the reason. The resolved backend is in the model's digest
(where it is not "native") and in every job's manifest.
"""

from __future__ import annotations

import logging
from typing import Any

from app.catalog import ModelSpec
from app.families import FAMILIES

NATIVE = "native"
FLASH_3 = "_flash_3"


class AttentionRefused(RuntimeError):
    """The model's backend cannot run on this worker."""


def resolved_backend(spec: ModelSpec, device: str, dtype: Any) -> str:
    """The backend the model will run: the catalog's, or what "auto" picks here."""
    family = FAMILIES.get(spec.family)
    if family is None or not family.attention_dispatch:
        return NATIVE
    if spec.attention_backend != "auto":
        return spec.attention_backend
    import torch

    half = dtype in (torch.float16, torch.bfloat16)
    if device.startswith("cuda") and half and _flash_3_installed():
        return FLASH_3
    return NATIVE


def _flash_3_installed() -> bool:
    from diffusers.models import attention_dispatch

    return bool(attention_dispatch._CAN_USE_FLASH_ATTN_3)


def apply_backend(pipeline: Any, backend: str) -> None:
    """Set `backend` on the denoiser's dispatching attention modules (none: nothing to
    set). Raises AttentionRefused with diffusers' reason where it cannot run here."""
    from workers.compiled import denoiser_name

    name = denoiser_name(pipeline)
    denoiser = getattr(pipeline, name) if name else None
    if denoiser is None or not hasattr(denoiser, "set_attention_backend"):
        return
    if not any(
        hasattr(getattr(m, "processor", None), "_attention_backend") for m in denoiser.modules()
    ):
        return  # processors that call SDPA themselves
    quiet = logging.getLogger("diffusers.models.modeling_utils")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "Attention backends are an experimental feature…"
    try:
        denoiser.set_attention_backend(backend)
    except (RuntimeError, ValueError, ImportError) as exc:
        raise AttentionRefused(str(exc)) from exc
    finally:
        quiet.setLevel(level)
