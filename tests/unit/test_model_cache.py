"""A worker's loaded models (workers/models.py): at most DIFFQ_WORKER_MAX_MODELS loaded
pipelines and at most the device budget of weights in bytes, least recently used out
(room made before a load, from the model's size), a served model loaded when a job needs
it, entries of the same weights sharing one pipeline."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from app.catalog import tiny_spec
from workers.models import ModelCache
from workers.pipelines import LoadedModel
from workers.unload import Demand

SIZES = {"a": 100, "b": 100, "c": 200, "d": 400}


def _cache(capacity: int, budget: int = 0, estimates: dict | None = None):
    specs = {n: tiny_spec(Path(f"/models/{n}"), name=n, queue="gpu.pool") for n in "abcd"}
    specs["a2"] = replace(specs["a"], name="a2")  # the same weights as a
    loaded = []

    def load(spec):
        loaded.append(spec.name)
        model = LoadedModel(spec, object(), "cpu", 0.0)
        model.bytes = SIZES[spec.path.name]
        return model

    def estimate(spec):
        return (estimates or SIZES)[spec.path.name]

    return ModelCache(specs, load, capacity, budget, estimate), loaded


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


def _gauge(name: str) -> float | None:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name)


def test_the_memory_budget_unloads_least_recent_models_before_a_load():
    cache, loaded = _cache(capacity=0, budget=300)
    assert _gauge("diffq_worker_model_budget_bytes") == 300
    assert _gauge("diffq_worker_model_bytes") == 0
    cache.get("a"), cache.get("b")
    assert cache.bytes == 200 and cache.fits("a2") and not cache.fits("c")
    assert _gauge("diffq_worker_model_bytes") == 200
    cache.get("a")  # b is now the least recent
    cache.get("c")  # needs 200 of the 300: b goes, a stays
    assert sorted(cache) == ["a", "c"] and cache.bytes == 300
    cache.get("b")  # 100 more: a (least recent) goes
    assert sorted(cache) == ["b", "c"] and cache.bytes == 300
    assert loaded == ["a", "b", "c", "b"]
    del cache["c"]  # what the gauge says follows every change
    assert _gauge("diffq_worker_model_bytes") == cache.bytes == 100


def test_a_model_over_the_budget_loads_alone_and_the_measured_size_replaces_the_estimate():
    cache, loaded = _cache(capacity=0, budget=320, estimates={**SIZES, "b": 10})
    cache.get("a"), cache.get("c")
    assert cache.fits("b")  # estimated at 10: it would fit beside a and c
    cache.get("d")  # 400 of a 320 budget: everything else goes, it loads alone
    assert list(cache) == ["d"] and loaded == ["a", "c", "d"]
    cache.get("b")  # estimated 10 but over with d: d goes; measured 100 from now on
    assert list(cache) == ["b"] and cache.size_of(cache.served["b"]) == 100


def test_both_bounds_hold_whichever_is_reached_first():
    cache, _ = _cache(capacity=2, budget=1000)
    cache.get("a"), cache.get("b")
    assert not cache.fits("c")  # bytes would fit, the count does not
    cache.get("c")
    assert sorted(cache) == ["b", "c"]


def test_the_listener_hears_every_change_of_the_loaded_set():
    """What the other workers' hold reads (app/jobs/residency.py): told after each load,
    each shared entry and each unload, the set as it is then."""
    cache, _ = _cache(capacity=1)
    heard = []
    cache.listener = heard.append
    cache.get("a")
    cache.get("a2")  # the same weights: an entry, no load
    cache.get("b")  # a and a2 go, then b comes
    assert heard[0] == ["a"] and heard[1] == ["a", "a2"]
    assert heard[-1] == ["b"] and all("b" not in names for names in heard[:-1])
    cache.get("b")  # already loaded: nothing changed, nothing said
    assert heard[-1] == ["b"] and len([n for n in heard if n == ["b"]]) == 1


def test_room_is_made_by_dropping_a_second_copy_before_the_fleets_only_one():
    """With the hold on, the runtime says which loaded models another worker holds too
    (`also_held`): the least recent of those goes first, else the least recent."""
    cache, _ = _cache(capacity=2)
    asked = []

    def also_held(names):
        asked.append(list(names))
        return {"b"}

    cache.also_held = also_held
    cache.get("a"), cache.get("b")  # a is the least recent, but b has a second copy
    cache.get("c")
    assert sorted(cache) == ["a", "c"] and asked == [["a", "b"]]
    cache.get("d")  # neither a nor c is held elsewhere: the least recent, a, goes
    assert sorted(cache) == ["c", "d"]


def test_with_demand_known_the_least_wanted_goes_before_the_least_recent():
    """With the hold on, the runtime also says each loaded model's demand (`demand`): the
    least recent model, with jobs queued, stays; the more recent one nobody wants goes."""
    cache, _ = _cache(capacity=2)
    asked = []

    def demand(names):
        asked.append(list(names))
        return {"a": Demand(queued=2)}

    cache.demand = demand
    cache.get("a"), cache.get("b")
    cache.get("c")
    assert sorted(cache) == ["a", "c"] and asked == [["a", "b"]]
    cache.demand = lambda names: {}  # the database cannot say: least recent first
    cache.get("d")
    assert sorted(cache) == ["c", "d"]


def test_a_quantized_entry_of_the_same_files_is_a_pipeline_of_its_own():
    """One model served as it is and with `quantize`: two pipelines, not one shared."""
    cache, loaded = _cache(capacity=0)
    cache.served["a8"] = replace(cache.served["a"], name="a8", quantize="int8")
    full, int8 = cache.get("a"), cache.get("a8")
    assert loaded == ["a", "a8"] and full.pipeline is not int8.pipeline
