"""The catalog's GPU keys: max_pixels_per_job (a 422 naming the fields), variant, vae_path,
safety_checker."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from app.catalog import CatalogError, tiny_spec
from app.config import load_settings
from app.rules import model_limit_errors

SPEC = replace(tiny_spec(Path("/models/tiny")), max_pixels_per_job=3 * 256 * 256)


def test_a_job_over_its_pixel_budget_is_refused_naming_the_fields():
    errors = model_limit_errors(SPEC, {"width": 512, "height": 512, "num_images": 1})
    assert set(errors) == {"width", "height", "num_images"}
    message = errors["num_images"][0]
    assert "512 x 512 x 1 = 262144" in message and "max_pixels_per_job" in message
    # Within every per-field limit, but four images are too many together.
    errors = model_limit_errors(SPEC, {"width": 256, "height": 256, "num_images": 4})
    assert "256 x 256 x 4 = 262144" in errors["num_images"][0]


def test_a_job_within_its_pixel_budget_passes():
    assert model_limit_errors(SPEC, {"width": 256, "height": 256, "num_images": 3}) == {}
    assert model_limit_errors(SPEC, {}) == {}  # the defaults fit
    unlimited = replace(SPEC, max_pixels_per_job=None)
    assert model_limit_errors(unlimited, {"width": 512, "height": 512, "num_images": 4}) == {}


def test_a_field_error_is_not_repeated_as_a_budget_error():
    errors = model_limit_errors(SPEC, {"width": 1000, "height": 512, "num_images": 4})
    assert not any("max_pixels_per_job" in m for ms in errors.values() for m in ms)


def _catalog(tmp_path, monkeypatch, body: str):
    from app.catalog import load_catalog

    models = tmp_path / "models.toml"
    models.write_text(body)
    monkeypatch.setenv("DIFFQ_MODELS_FILE", str(models))
    return load_catalog(load_settings())


def test_the_loading_keys_are_read_and_a_relative_vae_path_is_the_files_neighbour(
    tmp_path, monkeypatch
):
    catalog = _catalog(
        tmp_path,
        monkeypatch,
        '[models.sdxl]\npath = "sdxl"\nvariant = "fp16"\nvae_path = "vae-fp16-fix"\n'
        "safety_checker = true\nmax_pixels_per_job = 4194304\nmax_num_images = 4\n",
    )
    spec = catalog.models["sdxl"]
    assert spec.variant == "fp16" and spec.safety_checker is True
    assert spec.vae_path == tmp_path / "vae-fp16-fix"
    assert spec.max_pixels_per_job == 4194304
    plain = _catalog(tmp_path, monkeypatch, '[models.sd]\npath = "sd"\n').models["sd"]
    assert plain.variant is None and plain.vae_path is None and plain.safety_checker is False


def test_a_pixel_budget_below_one_default_image_is_refused(tmp_path, monkeypatch):
    with pytest.raises(CatalogError, match="max_pixels_per_job"):
        _catalog(tmp_path, monkeypatch, '[models.sd]\npath = "sd"\nmax_pixels_per_job = 100\n')
