"""ControlNets on a worker: loaded from the catalog when a job first names one, on its
model's device and dtype, kept beside the model (the least recently used dropped past
DIFFQ_WORKER_CONTROLNETS), and joined to the kind's pipeline by `from_pipe` (the model's
weights shared, no second copy: workers/call.py)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app.controls import Control
from app.families import FAMILIES
from workers.compiled import denoiser_name

if TYPE_CHECKING:
    from workers.pipelines import LoadedModel
    from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)


class ControlNetMissing(Exception):
    """A ControlNet the job names that this worker cannot load."""


def controlnets_for(
    rt: WorkerRuntime, model: LoadedModel, controls: Sequence[Control]
) -> dict[str, Any]:
    """The ControlNet modules the controls name, by name, loaded on `model`'s device and
    dtype; raises ControlNetMissing naming the one that cannot load."""
    found = {}
    for control in controls:
        if control.controlnet not in found:
            found[control.controlnet] = _module(rt, model, control.controlnet)
    return found


def _module(rt: WorkerRuntime, model: LoadedModel, name: str) -> Any:
    held: OrderedDict = model.controlnets
    if name in held:
        held.move_to_end(name)
        return held[name]
    spec = rt.catalog.controlnets.get(name)
    if spec is None:
        raise ControlNetMissing(f"the ControlNet {name!r} is not in this worker's catalog")
    import diffusers

    started = time.perf_counter()
    dtype = getattr(model.pipeline, "dtype", None)
    class_name = FAMILIES[model.spec.family].controlnet_class
    if class_name is None:  # the catalog refuses it; a second line
        raise ControlNetMissing(f"a {model.spec.family} model takes no ControlNet")
    found = _class_name(spec.path)
    if found is not None and found != class_name:
        raise ControlNetMissing(
            f"the ControlNet {name!r} is a {found}; model {model.spec.name!r} "
            f"({model.spec.family}) takes a {class_name} (its catalog family is wrong)"
        )
    try:
        module = getattr(diffusers, class_name).from_pretrained(spec.path, torch_dtype=dtype)
    except (OSError, ValueError, TypeError) as exc:
        raise ControlNetMissing(f"the ControlNet {name!r} did not load: {exc}") from exc
    module = module.to(model.device)
    mismatch = _mismatch(module, getattr(model.pipeline, denoiser_name(model.pipeline) or "", None))
    if mismatch:
        raise ControlNetMissing(
            f"the ControlNet {name!r} does not fit model {model.spec.name!r}: {mismatch} "
            "(its catalog family is wrong)"
        )
    limit = max(1, rt.settings.worker_controlnets)
    while len(held) >= limit:
        dropped, _ = held.popitem(last=False)
        for key in [k for k in model.kind_pipelines if isinstance(k, tuple) and dropped in k[1:]]:
            del model.kind_pipelines[key]
    held[name] = module
    log.info("ControlNet %s loaded in %.2fs", name, time.perf_counter() - started)
    return module


def _class_name(path: Any) -> str | None:
    """The diffusers class a saved ControlNet's config.json names (None: unreadable)."""
    import json
    from pathlib import Path

    try:
        return json.loads((Path(path) / "config.json").read_text()).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None


# The widths a ControlNet shares with its model's denoiser: the text embedding a UNet's
# cross-attention reads, the T5 sequence a FLUX transformer's joint attention reads.
# (Not `in_channels`: an inpainting UNet takes 9 where its ControlNets take 4.)
SHARED_WIDTHS = ("cross_attention_dim", "joint_attention_dim")


def _mismatch(module: Any, denoiser: Any) -> str:
    """How `module` does not fit `denoiser` ("" where it does)."""
    theirs = getattr(denoiser, "config", {})
    for key in SHARED_WIDTHS:
        wanted, has = theirs.get(key), module.config.get(key)
        if wanted is not None and has is not None and has != wanted:
            return f"its {key} is {has}, the model's {type(denoiser).__name__} has {wanted}"
    return ""


def derived_with(base: Any, auto_class: str, modules: Sequence[Any]) -> Any:
    """The kind's pipeline on `base`'s weights with these ControlNets (one, or several
    as diffusers' MultiControlNetModel)."""
    import diffusers

    chosen = modules[0] if len(modules) == 1 else list(modules)
    derived = getattr(diffusers, auto_class).from_pipe(base, controlnet=chosen)
    derived.set_progress_bar_config(disable=True)
    return derived
