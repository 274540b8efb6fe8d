"""ControlNets on a worker: loaded from the catalog when a job first names one, on its
model's device and dtype, kept beside the model (the least recently used dropped past
DIFFQ_WORKER_CONTROLNET_BYTES of their weights or DIFFQ_WORKER_CONTROLNETS of them, with
the pipelines derived with them), and joined to the kind's pipeline by `from_pipe` (the
model's weights shared, no second copy: workers/call.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from app.addons.base import AddonMissing, AddonWorker, ByteCache
from app.addons.controlnet.control import Control
from app.families import FAMILIES

log = logging.getLogger(__name__)


class ControlNetMissing(AddonMissing):
    """A ControlNet the job names that this worker cannot load."""

    code = "model_unavailable"


def controlnets_for(rt: Any, model: Any, controls: Sequence[Control]) -> dict[str, Any]:
    """The ControlNet modules the controls name, by name, loaded on `model`'s device and
    dtype; raises ControlNetMissing naming the one that cannot load."""
    found = {}
    for control in controls:
        if control.controlnet not in found:
            found[control.controlnet] = _module(rt, model, control.controlnet)
    return found


def held_by(rt: Any, model: Any) -> ByteCache[str]:
    """The ControlNets kept beside `model`, bounded as the settings say now; one that
    goes takes the pipelines derived with it along."""
    held: ByteCache[str] = model.controlnets
    if held.on_evict is None:
        derived = model.kind_pipelines  # shared by the entries that share these weights

        def forget(name: str, _module: Any) -> None:
            for key in [k for k in derived if isinstance(k, tuple) and name in k[1:]]:
                del derived[key]

        held.on_evict = forget
    held.max_bytes = rt.settings.worker_controlnet_bytes
    held.max_items = max(1, rt.settings.worker_controlnets)
    return held


def _module(rt: Any, model: Any, name: str) -> Any:
    held = held_by(rt, model)
    found = held.get(name)
    if found is not None:
        return found
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
    denoiser = getattr(model.pipeline, "unet", None) or getattr(model.pipeline, "transformer", None)
    mismatch = _mismatch(module, denoiser)
    if mismatch:
        raise ControlNetMissing(
            f"the ControlNet {name!r} does not fit model {model.spec.name!r}: {mismatch} "
            "(its catalog family is wrong)"
        )
    held.put(name, module, sum(p.numel() * p.element_size() for p in module.parameters()))
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


class ControlNetWorker(AddonWorker):
    """ControlNet's worker half (app/addons/base.py): a job's ControlNets loaded beside
    its model; the kind's pipeline derived with them, keyed by their names in order."""

    def fetch(
        self, rt: Any, model: Any, tenant_id: Any, items: Sequence[Control]
    ) -> dict[str, Any]:
        return controlnets_for(rt, model, items)

    def pipeline_key(self, items: Sequence[Control]) -> tuple[str, ...]:
        return tuple(c.controlnet for c in items)

    def derive(self, items: Sequence[Control], fetched: Mapping[str, Any]) -> dict[str, Any]:
        if not items:
            return {}
        modules = [fetched[c.controlnet] for c in items]
        return {"controlnet": modules[0] if len(modules) == 1 else modules}


CONTROLNET_WORKER = ControlNetWorker()
