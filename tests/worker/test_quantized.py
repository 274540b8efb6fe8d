"""Quantized weights (the catalog's `quantize`, workers/quantized.py) on the CPU with the
tiny model: `int8` loads the UNet's linear layers as 8-bit weights, makes an image close
to the full precision one but not the same bytes, the same bytes again from the same
seed, and another model digest (so another cache key); `fp8` on a CPU, on a GPU before
compute capability 8.9, or without the backend installed is refused before any weight is
read, naming the model and the reason; an unknown value is a catalog error."""

from __future__ import annotations

from dataclasses import replace
from importlib import util

import numpy as np
import pytest
import torch

from app.catalog import CatalogError, tiny_spec
from testbed.factories import generate_one, job_request
from workers import quantized
from workers.pipelines import ModelLoadError, load_model, model_identity


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_pipeline):
    root = tmp_path_factory.mktemp("quantized")
    tiny_pipeline.save_pretrained(root / "tiny")
    return root / "tiny"


def _pixels(model, seed: int = 5) -> np.ndarray:
    request = job_request(steps=3, seed=seed, width=64, height=64)
    return np.asarray(generate_one(model, request).images[0], dtype=np.float64)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a - b) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def test_int8_weights_make_a_close_image_not_the_same_bytes_and_another_digest(saved):
    spec = tiny_spec(saved)
    full = load_model(spec, "cpu")
    int8 = load_model(replace(spec, quantize="int8"), "cpu")
    layers = {type(m).__name__ for m in int8.pipeline.unet.modules()}
    assert "QLinear" in layers and "QLinear" not in {
        type(m).__name__ for m in full.pipeline.unet.modules()
    }
    assert int8.bytes < full.bytes  # 8-bit weights instead of 32
    assert int8.manifest["quantize"] == "int8" and full.manifest["quantize"] is None
    assert int8.digest != full.digest  # another cache key: never answers for the other
    exact, quant = _pixels(full), _pixels(int8)
    psnr = _psnr(exact, quant)
    print(f"\nint8 against float32: PSNR {psnr:.1f} dB, {int8.bytes} against {full.bytes} bytes")
    assert np.abs(exact - quant).max() > 0 and psnr > 25
    assert np.array_equal(quant, _pixels(int8))  # the same seed, the same bytes


def test_fp8_is_refused_on_a_cpu_before_any_weight_is_read(saved):
    spec = replace(tiny_spec(saved), name="tiny-fp8", quantize="fp8")
    message = r"model 'tiny-fp8': quantize = \"fp8\" needs a CUDA GPU .* runs on cpu"
    with pytest.raises(ModelLoadError, match=message):
        model_identity(spec, "cpu")  # what a worker's start asks of every served model
    with pytest.raises(ModelLoadError, match=message):
        load_model(spec, "cpu")


def test_fp8_is_refused_on_a_gpu_before_ada_and_taken_from_8_9(monkeypatch, saved):
    spec = replace(tiny_spec(saved), name="tiny-fp8", quantize="fp8")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA A100")
    with pytest.raises(quantized.QuantizationRefused, match=r"NVIDIA A100 has 8\.0"):
        quantized.check(spec, "cuda:0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    quantized.check(spec, "cuda:0")  # Hopper: runs


def test_without_the_backend_installed_a_quantized_model_is_refused(monkeypatch, saved):
    found = util.find_spec
    monkeypatch.setattr(
        util, "find_spec", lambda name, *a: None if name.startswith("optimum") else found(name)
    )
    with pytest.raises(ModelLoadError, match=r"needs optimum-quanto, which is not installed"):
        model_identity(replace(tiny_spec(saved), quantize="int8"), "cpu")
    model_identity(tiny_spec(saved), "cpu")  # an unquantized model does not need it


def test_an_unknown_quantization_is_a_catalog_error(saved):
    with pytest.raises(CatalogError, match=r"model 'tiny': quantize must be one of"):
        replace(tiny_spec(saved), quantize="int4").check()
