"""LoRA adapters on a worker: a warm cache in two levels.

- `AdapterMemory`, one per process: adapters read from the store (or a shared adapter's
  file) and parsed into CPU tensors, kept in an LRU bounded in bytes
  (DIFFQ_ADAPTER_CACHE_BYTES). Read and checked against its digest once; after that a
  job's adapter costs no store read and no parse.
- `PipelineAdapters`, one per loaded model: the adapters loaded into its pipeline (on
  its device), an LRU bounded in bytes on the device (DIFFQ_ADAPTER_DEVICE_BYTES, each
  adapter's tensors at the pipeline's dtype) and in count (DIFFQ_ADAPTER_SLOTS: each
  named adapter costs PEFT a little on every `set_adapters`). Loaded from memory with
  `low_cpu_mem_usage` (the tensors assigned, not copied twice); when the pipeline is
  full the least recently used adapters go, the last of them hot-swapped (its weights
  replaced in place, no new modules), falling back to deleting it and loading anew
  where a hot swap does not apply (another rank or other layers).

Each call activates exactly its jobs' adapters with their scales (`set_adapters`); a call
without adapters disables them all, and PEFT then runs the base layers alone: the image
is byte for byte the one a worker that never loaded an adapter makes
(tests/worker/test_adapters.py).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Container, Iterable, Mapping, Sequence
from typing import Any

from app.addons.base import AddonMissing, AddonWorker, ByteCache
from app.addons.lora import LORA
from app.addons.lora.item import Lora
from app.addons.lora.store import adapter_key
from app.metrics.instruments import (
    ADAPTER_EVICTIONS,
    ADAPTER_HITS,
    ADAPTER_LOAD_DURATION,
    ADAPTER_LOADS,
)
from app.storage.retry import get_kept

log = logging.getLogger(__name__)
# Adapter sets remembered as warm (each checked against the caches when asked).
WARM_SETS = 256


class AdapterMissing(AddonMissing):
    """An adapter the job names is no longer stored (deleted), or not what it was."""


class AdapterMemory:
    """Adapters as CPU tensors, by digest, LRU bounded in bytes (the file's size)."""

    def __init__(self, max_bytes: int) -> None:
        self._cache: ByteCache[str] = ByteCache(max_bytes, on_evict=_evicted)
        self._lock = threading.Lock()
        # adapter set -> its digests, most recent last (app/kinds `JobRequest.adapter_set`)
        self._sets: OrderedDict[str, tuple[str, ...]] = OrderedDict()

    def __contains__(self, sha256: str) -> bool:
        return sha256 in self._cache

    @property
    def max_bytes(self) -> int:
        return self._cache.max_bytes

    @property
    def bytes(self) -> int:
        return self._cache.bytes

    def tensors(self, rt: Any, tenant_id: Any, lora: Lora) -> dict[str, Any]:
        """The adapter's tensors (CPU), read and parsed on a miss."""
        found = self._cache.get(lora.sha256)
        if found is not None:
            ADAPTER_HITS.labels("memory").inc()
            return found
        started = time.perf_counter()
        data = _read(rt, tenant_id, lora)
        if hashlib.sha256(data).hexdigest() != lora.sha256:
            raise AdapterMissing(f"the adapter {lora.sha256[:12]}… changed since it was named")
        from safetensors.torch import load

        tensors = load(data)
        seconds = time.perf_counter() - started
        ADAPTER_LOADS.labels("store").inc()
        ADAPTER_LOAD_DURATION.labels("store").observe(seconds)
        log.info("adapter %s read from the store in %.3fs", lora.sha256[:12], seconds)
        self._cache.put(lora.sha256, tensors, len(data))
        return tensors

    def ran(self, loras: Iterable[Lora], adapter_set: str) -> None:
        """A job of this set ran here: remember it as a set this worker may hold."""
        if not adapter_set:
            return
        with self._lock:
            self._sets[adapter_set] = tuple(lora.sha256 for lora in loras)
            self._sets.move_to_end(adapter_set)
            while len(self._sets) > WARM_SETS:
                self._sets.popitem(last=False)

    def warm_sets(self, where: Container[str] | None = None) -> tuple[str, ...]:
        """The adapter sets whose adapters are all in memory now, or all in `where` (a
        pipeline's loaded adapters); "" (no adapters) always is."""
        inside = self._cache if where is None else where
        with self._lock:
            sets = list(self._sets.items())
        held = [key for key, shas in sets if all(s in inside for s in shas)]
        return ("", *held)


def _evicted(_sha256: str, _tensors: Any) -> None:
    ADAPTER_EVICTIONS.labels("memory").inc()


def _read(rt: Any, tenant_id: Any, lora: Lora) -> bytes:
    if lora.name is not None:  # a shared adapter: the catalog's file
        shared = rt.catalog.adapters.get(lora.name)
        if shared is None or not shared.path.is_file():
            raise AdapterMissing(f"the shared adapter {lora.name!r} is not on this worker")
        return shared.path.read_bytes()
    gone = f"the adapter {lora.sha256[:12]}… is no longer stored (deleted)"
    key = adapter_key(tenant_id, lora.sha256)
    return get_kept(rt.storage, key, rt.settings, AdapterMissing(gone))


class PipelineAdapters:
    """The adapters loaded into one model's pipeline, by digest, in named slots (LRU),
    at most `capacity` of them and `max_bytes` of their tensors on the device (0: no
    bound in bytes; one adapter is always let in). Used under the model's lock
    (workers/call.py).

    `fixed`: a compiled model's (workers/compiled.py): its slots, once made, are kept and
    all of them stay active (the call's adapters at their scales, the others at 0), so
    the graph torch.compile traced stays the graph: a new adapter is hot-swapped into a
    slot the call does not use (diffusers' `enable_lora_hotswap` padded the slots to the
    model's `lora_rank`), and each scale is a value written into the layers' scaling
    tensors, never a Python float the graph would be specialized on (`set_adapters`
    writes those): neither a swap nor a scale recompiles."""

    def __init__(self, slots: int, max_bytes: int = 0, *, fixed: bool = False) -> None:
        self.capacity = max(1, slots)
        self.max_bytes = max_bytes
        self.fixed = fixed
        # Fixed slots: each slot's LoRA layers' scaling at weight 1 (the adapter's own
        # alpha / rank), by slot name, as (the layer's scaling dict, that value).
        self._bases: dict[str, list[tuple[dict, float]]] = {}
        self._slots: OrderedDict[str, str] = OrderedDict()  # digest -> adapter name
        self._sizes: dict[str, int] = {}  # digest -> bytes on the device
        self._made = 0

    def __contains__(self, sha256: str) -> bool:
        return sha256 in self._slots

    @property
    def loaded(self) -> list[str]:
        return list(self._slots)

    @property
    def bytes(self) -> int:
        return sum(self._sizes.values())

    def _full(self, adding: int) -> bool:
        if len(self._slots) >= self.capacity:
            return True
        return self.max_bytes > 0 and self.bytes + adding > self.max_bytes

    def activate(
        self, pipeline: Any, loras: tuple[Lora, ...], tensors: Mapping[str, Mapping[str, Any]]
    ) -> None:
        """Exactly `loras` active with their scales; none when `loras` is empty."""
        if not loras:
            if self._slots:
                pipeline.disable_lora()
            return
        keep = {lora.sha256 for lora in loras}
        names = []
        for lora in loras:
            name = self._slots.get(lora.sha256)
            if name is not None:
                self._slots.move_to_end(lora.sha256)
                ADAPTER_HITS.labels("pipeline").inc()
            else:
                name = self._load(pipeline, lora.sha256, tensors[lora.sha256], keep)
            names.append(name)
        pipeline.enable_lora()
        if self.fixed:
            self._scale_fixed(dict(zip(names, (lora.scale for lora in loras), strict=True)))
            return
        pipeline.set_adapters(names, adapter_weights=[lora.scale for lora in loras])

    def _scale_fixed(self, weights: dict[str, float]) -> None:
        """Every slot's layers at its weight in this call (0: a slot the call does not
        use), written into their scaling tensors in place."""
        for name in self._slots.values():
            weight = weights.get(name, 0.0)
            for scaling, base in self._bases[name]:
                scaling[name].fill_(base * weight)

    def _fix_slots(self, pipeline: Any, name: str, made: bool) -> None:
        """After `name` was loaded (`made`: into a new slot) or hot-swapped: its layers'
        weight-1 scaling read; a new slot set active beside the others (`set_adapters`,
        once), and every slot's scalings made tensors again."""
        import torch

        layers = [
            module
            for component in pipeline.components.values()
            if isinstance(component, torch.nn.Module)
            for module in component.modules()
            if isinstance(getattr(module, "scaling", None), dict)
        ]
        self._bases[name] = [
            (m.scaling, float(m.scaling[name])) for m in layers if name in m.scaling
        ]
        if not made:
            return
        for gone in set(self._bases) - set(self._slots.values()) - {name}:
            del self._bases[gone]
        pipeline.set_adapters(sorted(self._bases))  # each slot active, in one order
        for slot, entries in self._bases.items():
            for scaling, base in entries:
                scaling[slot] = torch.tensor(base, device=pipeline.device)

    def _load(self, pipeline: Any, sha256: str, tensors: Mapping[str, Any], keep: set) -> str:
        started = time.perf_counter()
        copy = _on_device(pipeline, tensors)
        size = sum(value.numel() * value.element_size() for value in copy.values())
        name = None
        # The least recent adapters the call does not use go until this one fits; the
        # last to go lends its name (and modules) to a hot swap.
        while self._full(size):
            victim = next((s for s in self._slots if s not in keep), None)
            if victim is None:
                break  # all the call's own: it goes over the bound for this call
            if name is not None:
                pipeline.delete_adapters(name)
            name = self._slots.pop(victim)
            del self._sizes[victim]
            ADAPTER_EVICTIONS.labels("pipeline").inc()
        if name is not None:
            try:
                pipeline.load_lora_weights(copy, adapter_name=name, hotswap=True)
            except Exception as exc:  # noqa: BLE001 - another rank or other layers
                log.info("adapter hot swap did not apply (%s); loading anew", exc)
                pipeline.delete_adapters(name)
                name = None
                copy = _on_device(pipeline, tensors)
        made = name is None
        if made:
            self._made += 1
            name = f"diffq_{self._made}"
            pipeline.load_lora_weights(copy, adapter_name=name, low_cpu_mem_usage=True)
        self._slots[sha256] = name
        if self.fixed:
            self._fix_slots(pipeline, name, made)
        self._sizes[sha256] = size
        seconds = time.perf_counter() - started
        ADAPTER_LOADS.labels("memory").inc()
        ADAPTER_LOAD_DURATION.labels("memory").observe(seconds)
        log.info("adapter %s loaded into the pipeline in %.3fs", sha256[:12], seconds)
        return name


def _on_device(pipeline: Any, tensors: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the adapter's tensors on the pipeline's device and dtype: loading
    assigns them to the new layers (low_cpu_mem_usage) and a hot swap writes into those,
    so the cached tensors must never be handed over themselves."""
    denoiser = getattr(pipeline, "unet", None) or pipeline.transformer  # FLUX's
    device, dtype = denoiser.device, denoiser.dtype
    return {
        key: value.to(device=device, dtype=dtype if value.is_floating_point() else None, copy=True)
        for key, value in tensors.items()
    }


class LoraWorker(AddonWorker):
    """LoRA's worker half (app/addons/base.py): a job's adapters read into the worker's
    memory; a call's made active in its model's pipeline."""

    def fetch(self, rt: Any, model: Any, tenant_id: Any, items: Sequence[Lora]) -> dict[str, Any]:
        return {lora.sha256: rt.adapter_memory.tensors(rt, tenant_id, lora) for lora in items}

    def before_call(self, model: Any, items: Sequence[Lora], fetched: Mapping[str, Any]) -> None:
        if items or model.adapters.loaded:
            model.adapters.activate(model.pipeline, tuple(items), fetched)

    def ran(self, rt: Any, items: Sequence[Lora]) -> None:
        rt.adapter_memory.ran(items, LORA.set_key(items))


LORA_WORKER = LoraWorker()
