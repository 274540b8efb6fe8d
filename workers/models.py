"""The models a worker holds: every served model loaded at start (the default), or, with
DIFFQ_WORKER_MAX_MODELS, at most that many loaded pipelines, least recently used first
out, a model loaded (and warmed up) when a job needs it.

`ModelCache` is a mapping from model name to `LoadedModel` over the *loaded* models:
`name in cache` and iteration say what is warm now (the fair choice prefers those jobs:
app/jobs/fairness.py `Warmth`); `get(name)` loads a served model that is not loaded.
Entries that name the same weights (one model with two sets of limits) share one
pipeline and count as one.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import replace

from app.catalog import ModelSpec
from workers.pipelines import LoadedModel

log = logging.getLogger(__name__)


def weights_of(spec: ModelSpec) -> tuple:
    return (spec.path.resolve(), spec.dtype)


class ModelCache(MutableMapping[str, LoadedModel]):
    def __init__(
        self,
        served: dict[str, ModelSpec],
        load: Callable[[ModelSpec], LoadedModel],
        capacity: int = 0,
    ) -> None:
        self.served = served
        self.capacity = capacity  # loaded pipelines at most (0: every served model)
        self._load = load
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()
        self._lock = threading.RLock()
        self.loads = 0

    def __getitem__(self, name: str) -> LoadedModel:
        with self._lock:
            model = self._loaded[name]
            self._loaded.move_to_end(name)
            return model

    def __setitem__(self, name: str, model: LoadedModel) -> None:
        with self._lock:
            self._loaded[name] = model

    def __delitem__(self, name: str) -> None:
        with self._lock:
            del self._loaded[name]

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
                self._loaded[name] = replace(shared, spec=spec, manifest=manifest)
                return self._loaded[name]
            self._make_room()
            model = self._load(spec)
            self.loads += 1
            self._loaded[name] = model
            return model

    def pipelines(self) -> int:
        return len({id(m.pipeline) for m in self._loaded.values()})

    def _make_room(self) -> None:
        if self.capacity <= 0:
            return
        while self._loaded and self.pipelines() >= self.capacity:
            name, model = self._loaded.popitem(last=False)
            log.info("model %s unloaded (DIFFQ_WORKER_MAX_MODELS=%d)", name, self.capacity)
            if not any(m.pipeline is model.pipeline for m in self._loaded.values()):
                del model
                from workers.oom import free_accelerator_memory

                free_accelerator_memory()
