"""The conditioning cache through the worker's one call (CPU, the tiny model): a prompt
encoded once is taken from the cache after (the text encoder does not run again, the
images are the same bytes as without the cache), another prompt, negative prompt or
adapter set is another entry, the bound in bytes drops the least recently used, and the
pipeline is left as it was after each call."""

from __future__ import annotations

import io

import pytest

from app.kinds import KINDS
from app.metrics.instruments import CONDITIONING_HITS, CONDITIONING_SECONDS_SAVED
from workers import conditioning
from workers.call import generate


def _png(model, seed: int = 1, **fields) -> bytes:
    data = {"prompt": "a red fox", "seed": seed, "steps": 2, **fields}
    job = KINDS["txt2img"].normalize(model.spec, data)
    [out] = generate(model, [job], on_step=[lambda *_: True])
    buffer = io.BytesIO()
    out.images[0].save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def cache(monkeypatch):
    made = conditioning.ConditioningCache(64 * 1024**2)
    monkeypatch.setattr(conditioning, "CACHE", made)
    return made


@pytest.fixture
def encoder_runs(tiny_model):
    runs = []
    handle = tiny_model.pipeline.text_encoder.register_forward_pre_hook(lambda *_: runs.append(1))
    yield runs
    handle.remove()


def _hits(model) -> float:
    return CONDITIONING_HITS.labels(model.spec.name)._value.get()


def test_a_prompt_encoded_once_is_not_encoded_again_and_the_bytes_are_the_same(
    tiny_model, cache, encoder_runs, monkeypatch
):
    hits, saved = _hits(tiny_model), CONDITIONING_SECONDS_SAVED.labels("tiny")._value.get()
    first = _png(tiny_model, seed=1)
    encoded = len(encoder_runs)
    again = _png(tiny_model, seed=1)
    other_seed = _png(tiny_model, seed=2)
    print(f"text encoder runs: first call {encoded}, then {len(encoder_runs) - encoded}")
    assert encoded > 0 and len(encoder_runs) == encoded  # two hits, no further pass
    assert _hits(tiny_model) == hits + 2
    assert CONDITIONING_SECONDS_SAVED.labels("tiny")._value.get() > saved
    assert again == first
    assert "encode_prompt" not in vars(tiny_model.pipeline)  # the call's own, gone

    monkeypatch.setattr(conditioning, "CACHE", conditioning.ConditioningCache(0))
    assert _png(tiny_model, seed=1) == first  # without the cache: the same bytes
    assert _png(tiny_model, seed=2) == other_seed


def test_another_prompt_negative_or_guidance_is_another_entry(tiny_model, cache, encoder_runs):
    _png(tiny_model)
    for fields in (
        {"prompt": "a blue jay"},
        {"negative_prompt": "fog"},
        {"guidance_scale": 1.0},  # no unconditional pass: another encoding
    ):
        before = len(encoder_runs)
        _png(tiny_model, **fields)
        assert len(encoder_runs) > before, fields
    assert len(cache) == 4


def test_the_bound_in_bytes_drops_the_least_recently_used(tiny_model, monkeypatch):
    probe = conditioning.ConditioningCache(1024**3)
    monkeypatch.setattr(conditioning, "CACHE", probe)
    _png(tiny_model)
    one = probe.bytes
    bounded = conditioning.ConditioningCache(2 * one)
    monkeypatch.setattr(conditioning, "CACHE", bounded)
    for prompt in ("one", "two", "three"):
        _png(tiny_model, prompt=prompt)
    assert len(bounded) == 2 and bounded.bytes <= 2 * one
    keys = [key[3] for key in bounded._entries]
    assert [dict(k)["prompt"] for k in keys] == ["two", "three"]
