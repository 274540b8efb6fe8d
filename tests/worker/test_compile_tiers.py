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


def test_a_compiled_model_swaps_adapters_and_scales_without_recompiling(tmp_path):
    """A compiled model that takes LoRA keeps one slot per adapter a job may name, padded
    to its `lora_rank` (diffusers' enable_lora_hotswap): once its slots exist, a new
    adapter is hot-swapped into one the call does not use and a scale is a value, so the
    graph dynamo traced is reused: 0 new graphs across the swaps; each adapter still makes
    its own image."""
    import hashlib
    import io

    import torch
    from safetensors.torch import load
    from torch._dynamo.utils import counters

    from app.addons.lora import Lora
    from app.kinds import KINDS
    from workers.call import generate
    from workers.tiny import build_tiny_lora

    torch.set_num_threads(1)
    path = build_tiny_model(tmp_path / "tiny")
    spec = replace(
        tiny_spec(path),
        compile_sizes=("64x64",),
        compile_backend="aot_eager",
        max_loras=2,
        lora_rank=8,
    )
    model = load_model(spec, "cpu")
    assert model.adapters.fixed and model.adapters.capacity == 2
    tensors = {}
    for seed in (1, 2, 3, 4):
        data = build_tiny_lora(seed)
        tensors[hashlib.sha256(data).hexdigest()] = load(data)
    a, b, c, d = tensors

    def run(*loras: tuple[str, float]) -> bytes:
        data = {"prompt": "a kite", "seed": 4, "steps": 2, "width": 64, "height": 64}
        job = KINDS["txt2img"].normalize(spec, data)
        job = replace(job, loras=tuple(Lora(sha, scale) for sha, scale in loras))
        [out] = generate(model, [job], on_step=[lambda *_: True], addons={"loras": tensors})
        buffer = io.BytesIO()
        out.images[0].save(buffer, format="PNG")
        return buffer.getvalue()

    # The two slots made (each new slot is new LoRA layers: the one recompile).
    run((a, 1.0))
    run((a, 0.5), (b, 1.0))
    from app.metrics.instruments import COMPILED_GRAPHS

    counted = COMPILED_GRAPHS.labels(spec.name)._value.get()
    counters.clear()
    swapped = {
        "c": run((c, 1.0)),  # hot-swapped into a slot
        "d": run((d, 0.7)),  # into the other
        "a": run((a, 1.0), (c, 0.3)),  # a back, into d's
        "b": run((b, 0.9)),
    }
    graphs = counters["stats"]["unique_graphs"]
    print(f"new graphs across {len(swapped)} swaps: {graphs}")
    assert graphs == 0
    assert COMPILED_GRAPHS.labels(spec.name)._value.get() == counted  # the metric agrees
    assert len(set(swapped.values())) == len(swapped)  # each adapter set its own image
    assert run((c, 1.0)) == swapped["c"]  # c hot-swapped in again: its image again

    # What a model that never compiled makes with the same adapter and scale (the slot's
    # padding to lora_rank adds zeros: the same image, within a level of rounding).
    import numpy as np
    from PIL import Image

    eager = load_model(replace(spec, compile_sizes=()), "cpu")
    assert not eager.adapters.fixed
    model = eager
    plain = run((d, 0.7))
    difference = np.abs(
        np.asarray(Image.open(io.BytesIO(plain)), dtype=int)
        - np.asarray(Image.open(io.BytesIO(swapped["d"])), dtype=int)
    )
    assert difference.max() <= 1, difference.max()
