"""The catalog's `attention_backend` on the worker (CPU, the tiny FLUX model, whose
attention diffusers dispatches): set on the model's own attention modules, in its digest
(so in the result cache's key) and its manifest; "auto" is PyTorch's SDPA on a CPU; a
backend this worker cannot run stops the model's load naming it and the reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.catalog import CatalogError, _spec_from_table
from workers.pipelines import ModelLoadError, load_model


@pytest.fixture(scope="module")
def flux_spec(tmp_path_factory):
    from workers.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("attention")
    table = {
        "path": str(build_tiny_model(root / "flux", family="flux")),
        "family": "flux",
        "dtype": "float32",
        "default_width": 64,
        "default_height": 64,
        "max_pixels": 16384,
    }
    return _spec_from_table("tiny-flux", table, root)


def _backends(model) -> set:
    return {
        getattr(m.processor, "_attention_backend", None)
        for m in model.pipeline.transformer.modules()
        if hasattr(getattr(m, "processor", None), "_attention_backend")
    }


def test_auto_is_sdpa_on_a_cpu_and_a_named_backend_is_set_and_keyed(flux_spec):
    auto = load_model(flux_spec, "cpu")
    assert auto.manifest["attention_backend"] == "native"
    assert {str(getattr(b, "value", b)) for b in _backends(auto)} == {"native"}

    math = load_model(replace(flux_spec, attention_backend="_native_math"), "cpu")
    assert math.manifest["attention_backend"] == "_native_math"
    assert {str(getattr(b, "value", b)) for b in _backends(math)} == {"_native_math"}
    assert math.digest != auto.digest  # another kernel rounds otherwise: another cache key
    # Each model keeps its own: the second load did not change the first's modules.
    assert {str(getattr(b, "value", b)) for b in _backends(auto)} == {"native"}


def test_a_backend_this_worker_cannot_run_stops_the_load_naming_it(flux_spec):
    with pytest.raises(ModelLoadError, match=r"model 'tiny-flux': attention_backend 'sage'"):
        load_model(replace(flux_spec, attention_backend="sage"), "cpu")


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ({"family": "flux", "attention_backend": "flash_hub"}, "must be one of"),
        ({"family": "flux", "attention_backend": "magic"}, "must be one of"),
        ({"attention_backend": "_flash_3"}, "a sd model runs PyTorch's SDPA"),
    ],
)
def test_the_catalog_refuses_a_backend_it_cannot_offer(tmp_path, table, fragment):
    with pytest.raises(CatalogError, match=fragment):
        _spec_from_table("m", {"path": "/m", **table}, tmp_path)
