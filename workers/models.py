"""The models a worker holds: the served models that fit loaded at start, within the
device's memory budget for weights (DIFFQ_WORKER_MODEL_BYTES: by default 70 % of a GPU's
memory, no bound on the CPU; workers/footprint.py) and, with DIFFQ_WORKER_MAX_MODELS, at
most that many pipelines; least recently used first out, room made *before* a model is
loaded (from its estimated size), a model loaded (and warmed up) when a job needs it.

`ModelCache` is a mapping from model name to `LoadedModel` over the *loaded* models:
`name in cache` and iteration say what is warm now (the fair choice prefers those jobs:
app/jobs/fairness.py `Warmth`); `get(name)` loads a served model that is not loaded.
Entries that name the same weights (one model with two sets of limits) share one
pipeline and count as one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import replace

from app.catalog import ModelSpec
from app.metrics.instruments import WORKER_MODEL_BUDGET, WORKER_MODEL_BYTES
from workers.pipelines import LoadedModel
from workers.unload import Demand, Held, choose_victim

log = logging.getLogger(__name__)


def weights_of(spec: ModelSpec) -> tuple:
    """What makes two entries one pipeline: the same files, loaded the same way."""
    return (spec.path.resolve(), spec.dtype, spec.quantize)


class ModelCache(MutableMapping[str, LoadedModel]):
    def __init__(
        self,
        served: dict[str, ModelSpec],
        load: Callable[[ModelSpec], LoadedModel],
        capacity: int = 0,
        budget: int = 0,
        estimate: Callable[[ModelSpec], int] | None = None,
    ) -> None:
        self.served = served
        self.capacity = capacity  # loaded pipelines at most (0: no bound in count)
        self.budget = budget  # bytes of loaded weights at most (0: no bound)
        self._load = load
        self._estimate = estimate or (lambda _spec: 0)
        self._sizes: dict[tuple, int] = {}  # weights -> bytes measured when last loaded
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()
        self._lock = threading.RLock()
        self.loads = 0
        # Told the loaded names whenever they change (the runtime writes them down for the
        # other workers' hold: app/jobs/residency.py).
        self.listener: Callable[[list[str]], None] | None = None
        # Given the loaded names, those another worker holds too (the runtime asks
        # held_models): they are unloaded first, so that a worker makes room by dropping a
        # second copy before the fleet's only one. And each one's demand (the runtime asks
        # the jobs table): of the rest, the least wanted x slowest to reload goes
        # (workers/unload.py). Unset (the hold off): least recently used.
        self.also_held: Callable[[list[str]], set[str]] | None = None
        self.demand: Callable[[list[str]], dict[str, Demand]] | None = None
        self._loaded_at: dict[str, float] = {}  # name -> monotonic seconds
        WORKER_MODEL_BUDGET.set(budget)
        self._publish()

    @classmethod
    def holding(cls, models: Mapping[str, LoadedModel]) -> ModelCache:
        """A cache of models already loaded (serving exactly those)."""

        def cannot_load(spec: ModelSpec) -> LoadedModel:
            raise KeyError(spec.name)

        cache = cls({name: model.spec for name, model in models.items()}, cannot_load)
        for name, model in models.items():
            cache[name] = model
        return cache

    def __getitem__(self, name: str) -> LoadedModel:
        with self._lock:
            model = self._loaded[name]
            self._loaded.move_to_end(name)
            return model

    def __setitem__(self, name: str, model: LoadedModel) -> None:
        with self._lock:
            self._loaded_at[name] = time.monotonic()
            self._loaded[name] = model
            self._publish()

    def __delitem__(self, name: str) -> None:
        with self._lock:
            del self._loaded[name]
            self._publish()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._loaded))

    def __len__(self) -> int:
        return len(self._loaded)

    def get(self, name: str, default=None) -> LoadedModel | None:
        """The loaded model, loading a served one that is not (None: not served here)."""
        with self._lock:
            if name in self._loaded:
                return self[name]
            spec = self.served.get(name)
            if spec is None:
                return default
            shared = next(
                (m for m in self._loaded.values() if weights_of(m.spec) == weights_of(spec)),
                None,
            )
            if shared is not None:
                manifest = {**(shared.manifest or {}), "model": name}
                self._loaded_at[name] = time.monotonic()
                self._loaded[name] = replace(shared, spec=spec, manifest=manifest)
                self._publish()
                return self._loaded[name]
            self._make_room(spec)
            model = self._load(spec)
            self.loads += 1
            self._sizes[weights_of(spec)] = model.bytes
            self._loaded_at[name] = time.monotonic()
            self._loaded[name] = model
            self._publish()
            return model

    def pipelines(self) -> int:
        return len({id(m.pipeline) for m in self._loaded.values()})

    def _publish(self) -> None:
        """diffq_worker_model_bytes, and the listener: what is loaded now."""
        WORKER_MODEL_BYTES.set(self.bytes)
        if self.listener is not None:
            self.listener(list(self._loaded))

    def held(self) -> list[tuple[str, LoadedModel]]:
        """The loaded models, least recent first, without making any more recent."""
        with self._lock:
            return list(self._loaded.items())

    @property
    def bytes(self) -> int:
        """Bytes of the loaded weights (each pipeline once)."""
        return sum({id(m.pipeline): m.bytes for m in self._loaded.values()}.values())

    def size_of(self, spec: ModelSpec) -> int:
        """The model's bytes: as measured when last loaded here, else estimated."""
        known = self._sizes.get(weights_of(spec))
        return known if known is not None else self._estimate(spec)

    def fits(self, name: str) -> bool:
        """Whether a served model would load now without unloading another."""
        spec = self.served.get(name)
        if spec is None or not self._loaded:
            return spec is not None
        if self.capacity > 0 and self.pipelines() >= self.capacity:
            return False
        return self.budget <= 0 or self.bytes + self.size_of(spec) <= self.budget

    def _over(self, need: int) -> str | None:
        if self.capacity > 0 and self.pipelines() >= self.capacity:
            return f"DIFFQ_WORKER_MAX_MODELS={self.capacity}"
        if self.budget > 0 and self.bytes + need > self.budget:
            return f"{self.bytes + need} bytes of weights over the budget of {self.budget}"
        return None

    def _make_room(self, spec: ModelSpec) -> None:
        need = self.size_of(spec)
        while self._loaded and (reason := self._over(need)):
            name = self._victim()
            model = self._loaded.pop(name)
            self._loaded_at.pop(name, None)
            self._publish()
            log.info("model %s unloaded for %s (%s)", name, spec.name, reason)
            if not any(m.pipeline is model.pipeline for m in self._loaded.values()):
                del model
                from workers.oom import free_accelerator_memory

                free_accelerator_memory()
        if self.budget > 0 and need > self.budget:
            log.warning(
                "model %s: its %d bytes of weights exceed DIFFQ_WORKER_MODEL_BYTES (%d); "
                "loaded alone",
                spec.name,
                need,
                self.budget,
            )

    def _victim(self) -> str:
        """The model to unload: a second copy (another worker holds it too) first, then
        the least wanted x slowest to reload, least recent first among equals; with no
        demand to go by, the least recently used (workers/unload.py)."""
        names = list(self._loaded)
        copies = self.also_held(names) if self.also_held is not None else set()
        if self.demand is None:
            return choose_victim(self._held(names), {}, now=0.0, copies=copies, policy="lru")
        return choose_victim(
            self._held(names), self.demand(names), now=time.monotonic(), copies=copies
        )

    def _held(self, names: list[str]) -> list[Held]:
        return [
            Held(name, self._loaded_at.get(name, 0.0), self._loaded[name].reload_seconds)
            for name in names
        ]
