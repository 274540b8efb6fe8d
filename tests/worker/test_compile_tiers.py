"""torch.compile by size tier on the CPU: the catalog's compile_sizes are compiled and
warmed when the model starts (their seconds recorded), a job of a listed size runs on the
compiled denoiser without compiling again, any other size runs eager on the same weights."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.catalog import CatalogError, _spec_from_table, tiny_spec
from testbed.factories import generate_one, job_request
from workers.pipelines import load_model, warm_up
from workers.tiny import build_tiny_model


def test_only_the_listed_sizes_run_compiled_and_are_warmed_at_start(tmp_path):
    import torch
    from torch._dynamo.eval_frame import OptimizedModule
    from torch._dynamo.utils import counters

    torch.set_num_threads(1)
    path = build_tiny_model(tmp_path / "tiny")
    # aot_eager: dynamo's capture and the tier logic without inductor's code generation
    # (minutes on a shared CPU); inductor runs on the GPU (scripts/gpu-check).
    spec = replace(tiny_spec(path), compile_sizes=("64x64",), compile_backend="aot_eager")
    model = load_model(spec, "cpu")
    assert isinstance(model.compiled, OptimizedModule)
    assert model.pipeline.unet is not model.compiled  # eager between calls
    counters.clear()
    warm_up(model)
    assert set(model.warm_seconds) == {"warm_up", "warm_up 64x64"}
    assert model.warm_seconds["warm_up 64x64"] > 0
    compiled_frames = counters["stats"]["unique_graphs"]
    assert compiled_frames >= 1  # the tier was compiled during the warm-up

    def seen(job):
        denoisers = []

        def on_step(step, total):
            denoisers.append(type(model.pipeline.unet).__name__)
            return True

        images = generate_one(model, job, on_step=on_step).images
        return denoisers, images

    tiered, images = seen(job_request(spec, width=64, height=64, steps=2, seed=1))
    assert set(tiered) == {"OptimizedModule"}
    assert images[0].size == (64, 64)
    assert counters["stats"]["unique_graphs"] == compiled_frames  # no compile on a job
    other, images = seen(job_request(spec, width=128, height=64, steps=2, seed=1))
    assert set(other) == {"UNet2DConditionModel"}
    assert images[0].size == (128, 64)
    assert model.pipeline.unet is not model.compiled


def test_the_catalog_checks_the_compile_sizes(tmp_path):
    table = {"path": str(tmp_path), "max_width": 512, "max_height": 512}
    spec = _spec_from_table("m", {**table, "compile_sizes": ["512x512", "256x256"]}, tmp_path)
    assert spec.compile_tiers == ((512, 512), (256, 256))
    with pytest.raises(CatalogError, match="size 1024x1024 breaks"):
        _spec_from_table("m", {**table, "compile_sizes": ["1024x1024"]}, tmp_path)
    with pytest.raises(CatalogError, match="compile_backend must be one of"):
        _spec_from_table("m", {**table, "compile_backend": "tensorrt"}, tmp_path)
    with pytest.raises(CatalogError, match="is not WIDTHxHEIGHT"):
        _spec_from_table("m", {**table, "compile_sizes": ["big"]}, tmp_path)


def test_compiled_kernels_are_kept_under_the_home_unless_the_environment_names_a_place(
    tmp_path, monkeypatch
):
    """inductor reads TORCHINDUCTOR_CACHE_DIR when it compiles: the worker points it at
    DIFFQ_COMPILE_CACHE, so its next start reads the kernels (bench/cold_start.py
    --compile measures both starts), and leaves an operator's own choice alone."""
    from workers.compiled import use_compile_cache

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    kept = tmp_path / "home" / "compile-cache"
    assert use_compile_cache(kept) == str(kept)
    assert kept.is_dir()
    assert __import__("os").environ["TORCHINDUCTOR_CACHE_DIR"] == str(kept)

    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert cache_dir() == str(kept)  # where inductor itself will write

    theirs = tmp_path / "operator"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(theirs))
    assert use_compile_cache(kept) == str(theirs) and theirs.is_dir()
