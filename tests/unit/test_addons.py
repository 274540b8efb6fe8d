"""The add-on seam (app/addons): every add-on's part is taken from the registry by the
request, the stored row, the estimate, the batch key, the input images and the
manifest; and `ByteCache`, the LRU in bytes the worker halves keep their weights in."""

from __future__ import annotations

import dataclasses

import pytest

from app.addons import ADDONS, BY_BATCH_FIELD
from app.addons.base import AddonWorker, ByteCache
from app.addons.controlnet import Control
from app.addons.lora import Lora
from app.catalog import tiny_spec
from app.kinds import KINDS, request_from_stored

SPEC = tiny_spec("/nonexistent")
# One item of each add-on, as a job keeps it.
ITEMS = {
    "loras": (Lora("a" * 64, 0.5),),
    "controls": (Control("canny", "b" * 64, 0.7, 0.1, 0.9, "canny"),),
}


def _request(**addons):
    data = {"prompt": "p", "width": 64, "height": 64, "steps": 4, "seed": 1, **addons}
    return KINDS["txt2img"].normalize(SPEC, data)


def test_every_addon_is_covered_here():
    assert set(ITEMS) == set(ADDONS)


@pytest.mark.parametrize("name", sorted(ITEMS))
def test_an_addon_is_kept_keyed_estimated_and_batched_by_the_registry(name):
    addon, items = ADDONS[name], ITEMS[name]
    plain, carrying = _request(), _request(**{name: items})
    stored = carrying.stored()
    # Stored (and so in the cache key) only where there are some, as its `stored()` says.
    assert name not in plain.stored() and stored[name] == [i.stored() for i in items]
    assert name in carrying.cache_fields()
    back = request_from_stored(stored)
    assert getattr(back, name) == items and back == carrying
    # The estimate: each item adds the add-on's `work`.
    assert carrying.work == pytest.approx(plain.work * (1 + addon.work))
    # The estimate endpoint's stand-ins count as many (GET /v1/models/{name}/estimate).
    standing = _request(**{name: addon.placeholders(2)})
    assert standing.work == pytest.approx(plain.work * (1 + 2 * addon.work))
    # Batch compatibility: its set is a batch field, and differs from none.
    kind = KINDS["txt2img"]
    assert addon.batch_field in kind.batch_fields and BY_BATCH_FIELD[addon.batch_field] is addon
    assert getattr(carrying, addon.batch_field) == addon.set_key(items) != ""
    assert kind.batch_key(carrying) != kind.batch_key(plain)
    # Its input images are the job's.
    assert addon.inputs(items).items() <= kind.inputs(carrying).items()
    # Its worker half keeps the contract.
    assert isinstance(addon.worker_half(), AddonWorker)


def test_an_addons_set_key_follows_every_setting_that_changes_the_image():
    lora, control = ITEMS["loras"][0], ITEMS["controls"][0]
    loras, controls = ADDONS["loras"], ADDONS["controls"]
    assert loras.set_key((lora,)) != loras.set_key((dataclasses.replace(lora, scale=0.6),))
    for change in ({"scale": 0.5}, {"start": 0.2}, {"image": "c" * 64}, {"preprocess": "none"}):
        other = dataclasses.replace(control, **change)
        assert controls.set_key((control,)) != controls.set_key((other,)), change
    assert loras.set_key(()) == controls.set_key(()) == ""


def test_a_limit_past_the_models_is_one_refusal_naming_the_count():
    addon = ADDONS["controls"]
    most = addon.limit(SPEC, KINDS["txt2img"])
    values = [{"controlnet": "x", "image": "y"}] * (most + 1)
    done = addon.resolve(SPEC, KINDS["txt2img"], values, lookup=None)
    assert done.errors == [f"At most {most} controls for model 'tiny' (txt2img)."]
    assert addon.limit(SPEC, KINDS["txt2vid"]) == 0  # no control on a video kind


def test_a_byte_cache_is_bounded_in_bytes_and_count_and_hands_back_what_goes():
    gone = []
    cache = ByteCache(100, on_evict=lambda key, value: gone.append((key, value)))
    cache.put("a", "A", 40)
    cache.put("b", "B", 40)
    assert cache.get("a") == "A"  # now the most recent
    cache.put("c", "C", 40)  # 120 bytes: the least recent (b) goes
    assert gone == [("b", "B")] and list(cache) == ["a", "c"] and cache.bytes == 80
    cache.put("huge", "H", 500)  # one is always let in, however large
    assert list(cache) == ["huge"] and cache.bytes == 500
    assert [k for k, _ in gone] == ["b", "a", "c"]
    cache.max_items = 2
    cache.max_bytes = 10_000
    for key in "xyz":
        cache.put(key, key, 1)
    assert list(cache) == ["y", "z"] and cache.get("missing") is None
    cache.put("y", "Y", 5)  # put again: its size replaced, not added
    assert cache.bytes == 6 and cache.items() == {"z": "z", "y": "Y"}
