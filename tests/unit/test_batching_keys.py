"""The catalog's batching keys: max_batch, max_wait_ms, sizes (tiers), sizes_required."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from app.catalog import CatalogError, tiny_spec
from app.config import load_settings
from app.web.resources.jobs.schemas import model_limit_errors

TINY = tiny_spec(Path("/models/tiny"))


def _catalog(tmp_path, monkeypatch, body: str):
    from app.catalog import load_catalog

    models = tmp_path / "models.toml"
    models.write_text(body)
    monkeypatch.setenv("DIFFQ_MODELS_FILE", str(models))
    return load_catalog(load_settings())


def test_batching_keys_are_read_and_default_to_no_batching(tmp_path, monkeypatch):
    catalog = _catalog(
        tmp_path,
        monkeypatch,
        '[models.sd]\npath = "sd"\nmax_batch = 8\nmax_wait_ms = 50\n'
        'sizes = ["512x512", "768x768"]\n\n[models.plain]\npath = "p"\n',
    )
    sd, plain = catalog.models["sd"], catalog.models["plain"]
    assert (sd.max_batch, sd.max_wait_ms, sd.sizes) == (8, 50, ("512x512", "768x768"))
    assert sd.size_tiers == ((512, 512), (768, 768)) and not sd.sizes_required
    assert sd.batches(512, 512) and sd.batches(768, 768)
    assert not sd.batches(512, 768)  # outside the tiers: runs alone
    assert (plain.max_batch, plain.max_wait_ms, plain.sizes) == (1, 0, ())
    assert not plain.batches(512, 512)
    anything = replace(plain, max_batch=4)  # no tiers: every size batches
    assert anything.batches(512, 768)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("max_batch = 0", "max_batch"),
        ("max_wait_ms = -1", "max_wait_ms"),
        ('sizes = ["512"]', "WIDTHxHEIGHT"),
        ('sizes = ["2048x2048"]', "breaks the model's limits"),
        ('sizes = ["500x512"]', "breaks the model's limits"),
        ("sizes_required = true", "sizes_required needs sizes"),
        ('sizes = ["768x768"]\nsizes_required = true', "default size"),
    ],
)
def test_bad_batching_keys_are_refused(tmp_path, monkeypatch, body, message):
    with pytest.raises(CatalogError, match=message):
        _catalog(tmp_path, monkeypatch, f'[models.sd]\npath = "sd"\n{body}\n')


def test_a_size_outside_required_tiers_is_a_422_naming_the_fields():
    spec = replace(TINY, max_batch=4, sizes=("64x64", "128x128"), sizes_required=True)
    assert model_limit_errors(spec, {"width": 128, "height": 128}) == {}
    assert model_limit_errors(spec, {}) == {}  # the default size is a tier
    errors = model_limit_errors(spec, {"width": 128, "height": 64})
    assert set(errors) == {"width", "height"}
    assert "64x64, 128x128" in errors["width"][0]
    # Not required: the same request is valid (it runs unbatched).
    assert (
        model_limit_errors(replace(spec, sizes_required=False), {"width": 128, "height": 64}) == {}
    )
    # A field already wrong is not reported twice.
    errors = model_limit_errors(spec, {"width": 100, "height": 64})
    assert not any("must be one of" in m for ms in errors.values() for m in ms)
