"""The speed settings on a real CUDA device, in half precision (skipped where there is none):
each quality tier of the tiny SD model and FLUX's step caches, the conditioning cache's
bytes, and a model compiled with inductor hot-swapping LoRA adapters without recompiling.
The CPU runs the same mechanics in tests/worker (test_tiers, test_conditioning,
test_compile_tiers); here the device's own kernels run them."""

from __future__ import annotations

import hashlib
import io
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip(
        "no CUDA device visible to torch (torch.cuda.is_available() is False); "
        "run on a GPU machine to check the quality tiers, the conditioning cache and "
        "adapter swaps under inductor on CUDA",
        allow_module_level=True,
    )


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _run(model, **fields):
    from app.kinds import KINDS
    from workers.call import generate

    data = {"prompt": "a red fox", "seed": 3, "steps": 8, "width": 128, "height": 128, **fields}
    job = KINDS["txt2img"].normalize(model.spec, data)
    [out] = generate(model, [job], on_step=[lambda *_: True])
    return out


def test_each_tier_runs_in_fp16_and_exact_repeats_byte_for_byte(tmp_path):
    from app.catalog import tiny_spec
    from workers.pipelines import load_model
    from workers.tiny import build_tiny_model

    spec = replace(tiny_spec(build_tiny_model(tmp_path / "tiny")), dtype="float16")
    model = load_model(spec, "cuda")
    made = {tier: _run(model, quality=tier) for tier in ("exact", "balanced", "fast")}
    print({tier: out.quality for tier, out in made.items()})
    assert made["fast"].quality == {"tier": "fast", "guidance_until": 0.5, "guided_steps": 4}
    pngs = {tier: _png(out.images[0]) for tier, out in made.items()}
    assert len(set(pngs.values())) == 3  # each tier its own image
    assert _png(_run(model, quality="exact").images[0]) == pngs["exact"]


def test_flux_step_caches_skip_attention_in_bf16(tmp_path):
    from app.catalog import _spec_from_table
    from workers.pipelines import load_model
    from workers.tiny import build_tiny_model

    table = {
        "path": str(build_tiny_model(tmp_path / "flux", family="flux")),
        "family": "flux",
        "dtype": "bfloat16",
        "default_width": 128,
        "default_height": 128,
        "max_pixels": 16384,
        "size_multiple": 16,
        "tiers": {"fast": {"threshold": 0.5}},
    }
    model = load_model(_spec_from_table("tiny-flux", table, tmp_path), "cuda")
    runs = []
    for name, module in model.pipeline.transformer.named_modules():
        if name.endswith("attn.to_q"):
            module.register_forward_pre_hook(lambda *_: runs.append(1))
    exact = _run(model, quality="exact")
    full = len(runs)
    runs.clear()
    fast = _run(model, quality="fast")
    print(f"attention runs over 8 steps: exact {full}, fast {len(runs)}")
    assert fast.quality == {"tier": "fast", "step_cache": "first_block", "threshold": 0.5}
    assert len(runs) < full
    assert _png(fast.images[0]) != _png(exact.images[0])
    assert not model.pipeline.transformer.is_cache_enabled


def test_the_conditioning_cache_gives_the_same_bytes_on_cuda(tmp_path, monkeypatch):
    from app.catalog import tiny_spec
    from workers import conditioning
    from workers.pipelines import load_model
    from workers.tiny import build_tiny_model

    spec = replace(tiny_spec(build_tiny_model(tmp_path / "tiny")), dtype="float16")
    model = load_model(spec, "cuda")
    runs = []
    model.pipeline.text_encoder.register_forward_pre_hook(lambda *_: runs.append(1))
    monkeypatch.setattr(conditioning, "CACHE", conditioning.ConditioningCache(64 * 1024**2))
    first = _png(_run(model).images[0])
    encoded = len(runs)
    assert _png(_run(model).images[0]) == first
    assert encoded > 0 and len(runs) == encoded  # the second call took the cache's
    monkeypatch.setattr(conditioning, "CACHE", conditioning.ConditioningCache(0))
    assert _png(_run(model).images[0]) == first  # and without the cache: the same bytes


def test_a_model_compiled_with_inductor_swaps_adapters_without_recompiling(tmp_path):
    from safetensors.torch import load
    from torch._dynamo.utils import counters

    from app.addons.lora import Lora
    from app.catalog import tiny_spec
    from app.kinds import KINDS
    from workers.call import generate
    from workers.pipelines import load_model
    from workers.tiny import build_tiny_lora, build_tiny_model

    spec = replace(
        tiny_spec(build_tiny_model(tmp_path / "tiny")),
        dtype="float16",
        compile_sizes=("128x128",),
        compile_backend="inductor",
        max_loras=2,
        lora_rank=8,
    )
    model = load_model(spec, "cuda")
    tensors = {}
    for seed in (1, 2, 3):
        data = build_tiny_lora(seed)
        tensors[hashlib.sha256(data).hexdigest()] = load(data)
    a, b, c = tensors

    def run(*loras: tuple[str, float]) -> bytes:
        data = {"prompt": "a kite", "seed": 4, "steps": 2, "width": 128, "height": 128}
        job = KINDS["txt2img"].normalize(spec, data)
        job = replace(job, loras=tuple(Lora(sha, scale) for sha, scale in loras))
        [out] = generate(model, [job], on_step=[lambda *_: True], addons={"loras": tensors})
        return _png(out.images[0])

    run((a, 1.0))
    run((a, 0.5), (b, 1.0))  # both slots made
    counters.clear()
    swapped = [run((c, 1.0)), run((b, 0.7)), run((a, 1.0), (c, 0.3))]
    graphs = counters["stats"]["unique_graphs"]
    print(f"new graphs across {len(swapped)} swaps under inductor: {graphs}")
    assert graphs == 0
    assert len(set(swapped)) == len(swapped)
