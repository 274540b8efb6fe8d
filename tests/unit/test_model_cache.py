"""A worker's loaded models (workers/models.py): at most DIFFQ_WORKER_MAX_MODELS loaded
pipelines, least recently used out, a served model loaded when a job needs it, entries
of the same weights sharing one pipeline."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from app.catalog import tiny_spec
from workers.models import ModelCache
from workers.pipelines import LoadedModel


def _cache(capacity: int):
    specs = {n: tiny_spec(Path(f"/models/{n}"), name=n, queue="gpu.pool") for n in "abc"}
    specs["a2"] = replace(specs["a"], name="a2")  # the same weights as a
    loaded = []

    def load(spec):
        loaded.append(spec.name)
        return LoadedModel(spec, object(), "cpu", 0.0)

    return ModelCache(specs, load, capacity), loaded


def test_at_most_capacity_pipelines_least_recent_out_loaded_when_needed():
    cache, loaded = _cache(capacity=2)
    assert cache.get("a").spec.name == "a" and cache.get("b").spec.name == "b"
    assert list(cache) == ["a", "b"]
    cache.get("a")  # a is now the most recent
    cache.get("c")  # b goes
    assert sorted(cache) == ["a", "c"] and "b" not in cache
    cache.get("b")  # a goes
    assert sorted(cache) == ["b", "c"]
    assert loaded == ["a", "b", "c", "b"] and cache.loads == 4
    assert cache.get("unserved") is None


def test_entries_of_the_same_weights_share_one_pipeline_and_count_once():
    cache, loaded = _cache(capacity=2)
    a = cache.get("a")
    a2 = cache.get("a2")
    assert a2.pipeline is a.pipeline and a2.spec.name == "a2"
    assert a2.manifest == {"model": "a2"}
    cache.get("b")
    assert loaded == ["a", "b"] and cache.pipelines() == 2 and len(cache) == 3


def test_capacity_zero_keeps_every_model():
    cache, loaded = _cache(capacity=0)
    for name in ("a", "b", "c"):
        cache.get(name)
    assert sorted(cache) == ["a", "b", "c"] and loaded == ["a", "b", "c"]
