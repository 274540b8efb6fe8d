"""torch.compile by size tier on the CPU: the catalog's compile_sizes are compiled and
warmed when the model starts (their seconds recorded), a job of a listed size runs the
compiled code without compiling again, any other size runs eager on the same module; a
transformer's repeated blocks are compiled in place of the whole model (compile_scope)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.catalog import CatalogError, _spec_from_table, tiny_spec
from testbed.factories import generate_one, job_request
from workers.pipelines import ModelLoadError, load_model, warm_up
from workers.tiny import build_tiny_model


class Counting:
    """A torch.compile backend that runs dynamo's graphs as they are (the `eager`
    backend) and counts the graphs traced and the times compiled code ran."""

    def __init__(self) -> None:
        self.graphs = 0
        self.runs = 0

    def __call__(self, graph, example_inputs):
        self.graphs += 1

        def run(*args):
            self.runs += 1
            return graph.forward(*args)

        return run


def _compiled_spec(path, backend, **changes):
    """The tiny model's entry with a 64² compile tier; a family's own quality tiers."""
    spec = tiny_spec(path)
    if "family" in changes:
        changes = {"tiers": None, "quality": None, **changes}
    return replace(spec, compile_sizes=("64x64",), compile_backend=backend, **changes)


def test_only_the_listed_sizes_run_compiled_and_are_warmed_at_start(tmp_path):
    import torch

    torch.set_num_threads(1)
    path = build_tiny_model(tmp_path / "tiny")
    backend = Counting()
    spec = _compiled_spec(path, backend)
    model = load_model(spec, "cpu")
    assert model.compiled == "model"  # auto: a UNet is compiled whole
    unet = model.pipeline.unet  # compiled in place: one module, its own names
    warm_up(model)
    assert set(model.warm_seconds) == {"warm_up", "warm_up 64x64"}
    assert model.warm_seconds["warm_up 64x64"] > 0
    traced = backend.graphs
    assert traced >= 1  # the tier was compiled during the warm-up

    def ran(job):
        before = backend.runs
        images = generate_one(model, job).images
        return backend.runs - before, images

    runs, images = ran(job_request(spec, width=64, height=64, steps=2, seed=1))
    assert runs >= 2 and images[0].size == (64, 64)  # a compiled run a step, at least
    assert backend.graphs == traced  # no compile on a job
    runs, other = ran(job_request(spec, width=128, height=64, steps=2, seed=1))
    assert runs == 0 and other[0].size == (128, 64)  # eager: the compiled code left alone
    assert backend.graphs == traced
    assert model.pipeline.unet is unet

    # The same request on a model that never compiled: dynamo's graphs run as traced, so
    # the same image (the compiled call and the eager one run the same operations).
    eager = load_model(replace(spec, compile_sizes=()), "cpu")
    assert not eager.compiled
    again = generate_one(eager, job_request(spec, width=64, height=64, steps=2, seed=1)).images
    assert again[0].tobytes() == images[0].tobytes()


def test_a_transformer_compiles_its_repeated_blocks_in_place(tmp_path):
    """`auto` on FLUX: each of its blocks compiled in place (diffusers'
    compile_repeated_blocks), the transformer around them not; the listed size runs the
    blocks' compiled code, another size none of it; `model` compiles it whole."""
    import torch

    torch.set_num_threads(1)
    path = build_tiny_model(tmp_path / "flux", family="flux")
    backend = Counting()
    spec = _compiled_spec(path, backend, family="flux", size_multiple=16)
    model = load_model(spec, "cpu")
    transformer = model.pipeline.transformer
    blocks = [*transformer.transformer_blocks, *transformer.single_transformer_blocks]
    assert model.compiled == "blocks"
    assert all(block._compiled_call_impl is not None for block in blocks)
    assert transformer._compiled_call_impl is None
    warm_up(model)
    traced = backend.graphs
    assert traced >= 1
    before = backend.runs
    generate_one(model, job_request(spec, width=64, height=64, steps=2, seed=1))
    assert backend.runs - before >= 2 * len(blocks)  # every block, every step
    assert backend.graphs == traced
    before = backend.runs
    generate_one(model, job_request(spec, width=128, height=64, steps=2, seed=1))
    assert backend.runs == before and backend.graphs == traced

    whole = load_model(replace(spec, compile_scope="model"), "cpu")
    assert whole.compiled == "model"
    assert all(b._compiled_call_impl is None for b in whole.pipeline.transformer.transformer_blocks)


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_no_job_of_a_compiled_size_compiles_after_the_warm_up(tmp_path, scope):
    """Dynamo compiles a graph per batch of rows it has not seen: the warm-up runs one
    row, two, and the most a call can carry, so no job compiles, whatever its images,
    its tier (a guidance cut halves the rows mid-call) or its guidance (none: one row an
    image), alone or in a batch."""
    import torch

    from workers.call import generate

    torch.set_num_threads(1)
    path = build_tiny_model(tmp_path / "tiny")
    backend = Counting()
    spec = _compiled_spec(path, backend, compile_scope=scope, max_num_images=3, max_batch=2)
    model = load_model(spec, "cpu")
    warm_up(model)
    traced = backend.graphs
    print(f"graphs traced by the warm-up: {traced}")
    for images in range(1, spec.max_num_images + 1):
        for tier in spec.quality:
            for guidance in (7.5, 1.0):
                job = job_request(
                    spec, steps=4, seed=1, num_images=images, quality=tier, guidance_scale=guidance
                )
                generate_one(model, job)
                assert backend.graphs == traced, (images, tier, guidance)
    jobs = [job_request(spec, steps=3, seed=s, num_images=spec.max_num_images) for s in (1, 2)]
    generate(model, jobs, on_step=[lambda *_: True] * len(jobs))
    assert backend.graphs == traced


def test_the_warm_up_calls_stay_within_what_a_job_may_carry(tmp_path):
    """The largest warm-up call is a whole batch of the most images one job may carry at
    that size; a video model's jobs are one clip each."""
    from app.catalog import tiny_video_spec
    from workers.compiled import compile_shapes

    spec = replace(tiny_spec(tmp_path), max_num_images=4, max_batch=2)
    request = job_request(spec, width=64, height=64)
    assert [c.num_images for c in compile_shapes(spec, request)] == [1, 1, 8]
    assert [c.guidance_scale for c in compile_shapes(spec, request)][1] == 1.0
    bounded = replace(spec, max_pixels_per_job=64 * 64 * 3)
    assert compile_shapes(bounded, request)[-1].num_images == 6
    video = tiny_video_spec(tmp_path)
    clip = job_request(video, kind="txt2vid", width=64, height=64, num_frames=9, fps=24)
    assert [c.num_images for c in compile_shapes(video, clip)] == [1, 1]


def test_a_step_cache_call_runs_eager_on_a_compiled_model(tmp_path):
    """A tier whose step cache hooks the denoiser's blocks runs eager even at a compiled
    size: the hooks would make dynamo trace again."""
    import torch

    torch.set_num_threads(1)
    path = build_tiny_model(tmp_path / "flux", family="flux")
    backend = Counting()
    spec = _compiled_spec(path, backend, family="flux", size_multiple=16)
    model = load_model(spec, "cpu")
    warm_up(model)
    cached = next(tier.name for tier in spec.tiers if tier.step_cache)
    traced, before = backend.graphs, backend.runs
    job = job_request(spec, width=64, height=64, steps=3, seed=1, quality=cached)
    assert generate_one(model, job).quality["tier"] == cached
    assert backend.runs == before and backend.graphs == traced


def test_a_control_call_runs_eager_on_a_compiled_model(tmp_path):
    """A ControlNet's residuals are denoiser inputs the warm-up never compiled: a call
    with a control runs eager at a compiled size, and one without runs compiled."""
    import torch
    from PIL import Image

    from app.addons.controlnet.control import input_field
    from app.kinds import KINDS
    from workers.call import generate
    from workers.tiny import tiny_controlnet

    torch.set_num_threads(1)
    backend = Counting()
    spec = _compiled_spec(build_tiny_model(tmp_path / "tiny"), backend)
    model = load_model(spec, "cpu")
    warm_up(model)
    traced, before = backend.graphs, backend.runs
    data = {"prompt": "a fox", "seed": 3, "steps": 2, "width": 64, "height": 64}
    controlled = {**data, "controls": [{"image": "0" * 64, "controlnet": "edges"}]}
    job = KINDS["txt2img"].normalize(spec, controlled)
    inputs = {input_field(0): Image.new("RGB", (64, 64), (255, 255, 255))}
    addons = {"controls": {"edges": tiny_controlnet(seed=1)}}
    generate(model, [job], on_step=[lambda *_: True], inputs=[inputs], addons=addons)
    assert backend.runs == before and backend.graphs == traced
    generate_one(model, KINDS["txt2img"].normalize(spec, data))
    assert backend.runs > before and backend.graphs == traced


def test_a_block_scope_needs_repeated_blocks(tmp_path):
    """SD3's transformer names no repeated blocks: `blocks` stops the load, naming the
    setting; `auto` compiles it whole."""
    path = build_tiny_model(tmp_path / "sd3", family="sd3")
    spec = _compiled_spec(path, "eager", family="sd3", size_multiple=16)
    with pytest.raises(ModelLoadError, match=r"compile_scope.*no repeated blocks"):
        load_model(replace(spec, compile_scope="blocks"), "cpu")
    assert load_model(spec, "cpu").compiled == "model"


def test_the_catalog_checks_the_compile_sizes(tmp_path):
    table = {"path": str(tmp_path), "max_width": 512, "max_height": 512}
    spec = _spec_from_table("m", {**table, "compile_sizes": ["512x512", "256x256"]}, tmp_path)
    assert spec.compile_tiers == ((512, 512), (256, 256))
    with pytest.raises(CatalogError, match="size 1024x1024 breaks"):
        _spec_from_table("m", {**table, "compile_sizes": ["1024x1024"]}, tmp_path)
    with pytest.raises(CatalogError, match="compile_backend must be one of"):
        _spec_from_table("m", {**table, "compile_backend": "tensorrt"}, tmp_path)
    with pytest.raises(CatalogError, match="compile_scope must be one of"):
        _spec_from_table("m", {**table, "compile_scope": "layers"}, tmp_path)
    assert _spec_from_table("m", {**table, "compile_scope": "blocks"}, tmp_path).compile_scope
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


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_a_compiled_model_swaps_adapters_and_scales_without_recompiling(tmp_path, scope):
    """A compiled model that takes LoRA keeps one slot per adapter a job may name, padded
    to its `lora_rank` (diffusers' enable_lora_hotswap): once its slots exist, a new
    adapter is hot-swapped into one the call does not use and a scale is a value, so the
    graph dynamo traced is reused: 0 new graphs across the swaps; each adapter still makes
    its own image. The same whether the UNet is compiled whole or its transformer blocks,
    where the adapters' layers are, are compiled each in place."""
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
        compile_scope=scope,
    )
    model = load_model(spec, "cpu")
    assert model.compiled == scope
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
