"""The conditioning cache: a worker keeps the text encoders' outputs of recent calls, so a
prompt encoded once is not encoded again (a T5-XXL's pass is 0.4-0.6 s on a large model).

Every diffusers pipeline encodes its prompts in `encode_prompt`; for one call, the call's
pipeline gets an `encode_prompt` of its own (an instance attribute, removed when the call
ends) that looks the arguments up first. The key is the model's digest, the pipeline's
class, every argument `encode_prompt` was given (the prompts, the negative prompts, the
images per prompt, guidance on or off, `clip_skip`, `max_sequence_length`, the LoRA scale,
the device and dtype) and the call's adapter set (a LoRA adapter may touch the text
encoders). A call that hands in embeddings of its own, or an argument the key cannot
hold, is not cached. A hit returns copies of the very tensors the miss computed, so the
images are the same bytes with and without the cache (tests/worker/test_conditioning.py).

The entries live on the model's device, least recently used dropped past
`DIFFQ_WORKER_CONDITIONING_BYTES` (0: no cache). Hits, misses and the encode seconds each
hit saved are metrics (`diffq_conditioning_cache_*`).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from app.metrics.instruments import (
    CONDITIONING_HITS,
    CONDITIONING_MISSES,
    CONDITIONING_SECONDS_SAVED,
)


class _Uncacheable(Exception):
    """An argument the key cannot hold (a tensor: embeddings handed in)."""


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    import torch

    if isinstance(value, torch.device | torch.dtype):
        return str(value)
    raise _Uncacheable(type(value).__name__)


def _nbytes(value: Any) -> int:
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return int(getattr(value, "nbytes", 0) or 0)


def _copied(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_copied(v) for v in value)
    if isinstance(value, list):
        return [_copied(v) for v in value]
    return value.clone() if hasattr(value, "clone") else value


class ConditioningCache:
    """Text-encoder outputs by key, least recently used first, at most `limit` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._entries: OrderedDict[tuple, tuple[Any, int, float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple) -> tuple[Any, float] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0], entry[2]

    def put(self, key: tuple, value: Any, seconds: float) -> None:
        size = _nbytes(value)
        if size > self.limit:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            while self._entries and self.bytes + size > self.limit:
                _, (_, dropped, _) = self._entries.popitem(last=False)
                self.bytes -= dropped
            self._entries[key] = (value, size, seconds)
            self.bytes += size

    @contextmanager
    def around(self, pipeline: Any, model: str, scope: tuple) -> Iterator[None]:
        """`pipeline.encode_prompt` looked up in the cache for the length of one call;
        `model`: the loaded model's digest and name; `scope`: what else the outputs depend
        on (the call's adapter set)."""
        encode = getattr(pipeline, "encode_prompt", None)
        if self.limit <= 0 or encode is None or "encode_prompt" in vars(pipeline):
            yield
            return
        signature = inspect.signature(encode)

        def cached(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
                arguments = tuple((k, _plain(v)) for k, v in sorted(bound.arguments.items()))
            except (TypeError, _Uncacheable):
                return encode(*args, **kwargs)
            key = (model, type(pipeline).__name__, scope, arguments)
            found = self.get(key)
            if found is not None:
                value, seconds = found
                CONDITIONING_HITS.labels(model_label).inc()
                CONDITIONING_SECONDS_SAVED.labels(model_label).inc(seconds)
                return _copied(value)
            CONDITIONING_MISSES.labels(model_label).inc()
            started = time.perf_counter()
            value = encode(*args, **kwargs)
            self.put(key, _copied(value), time.perf_counter() - started)
            return value

        model_label = model.rpartition(":")[2]
        pipeline.encode_prompt = cached
        try:
            yield
        finally:
            del pipeline.encode_prompt


# The worker's one cache (workers/runtime.py sizes it from its settings; 0 until then).
CACHE = ConditioningCache(0)
