"""SD3 and FLUX (tiny, random weights) in half precision on CUDA, and a compile tier
with inductor on CUDA (skipped where there is no CUDA device)."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip(
        "no CUDA device visible to torch (torch.cuda.is_available() is False); "
        "run on a GPU machine to check SD3, FLUX and compile tiers on CUDA",
        allow_module_level=True,
    )


def _spec(path, **values):
    from app.catalog import tiny_spec

    return replace(tiny_spec(path), **values)


@pytest.mark.parametrize(("family", "dtype"), [("sd3", "float16"), ("flux", "bfloat16")])
def test_a_flow_family_generates_in_half_precision_on_cuda(tmp_path, family, dtype):
    from app.rules import schedulers_for
    from testbed.factories import generate_one, job_request
    from workers.pipelines import load_model, warm_up
    from workers.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / family, family=family)
    spec = _spec(
        path, family=family, dtype=dtype, size_multiple=16, schedulers=schedulers_for(family)
    )
    model = load_model(spec, "cuda")
    warm_up(model)
    request = job_request(spec, width=128, height=128, steps=4, seed=3, num_images=2)
    first = generate_one(model, request).images
    second = generate_one(model, request).images
    assert [i.tobytes() for i in first] == [i.tobytes() for i in second]
    for image in first:
        low, high = image.convert("L").getextrema()
        assert high > low, "a flat image: half precision produced no picture"


@pytest.mark.parametrize(
    ("family", "dtype", "scope"), [("sd", "float16", "model"), ("flux", "bfloat16", "blocks")]
)
def test_a_compile_tier_runs_compiled_with_inductor_on_cuda(tmp_path, family, dtype, scope):
    """The UNet compiled whole, FLUX's blocks compiled in place (`auto`), with inductor:
    the warm-up compiles, a job of the tier's size compiles nothing more."""
    from torch._dynamo.utils import counters

    from testbed.factories import generate_one, job_request
    from workers.pipelines import load_model, warm_up
    from workers.tiny import build_tiny_model

    multiple = 8 if family == "sd" else 16
    spec = _spec(
        build_tiny_model(tmp_path / family, family=family),
        family=family,
        dtype=dtype,
        size_multiple=multiple,
        compile_sizes=("128x128",),
    )
    model = load_model(spec, "cuda")
    assert model.compiled == scope
    counters.clear()
    warm_up(model)
    assert model.warm_seconds["warm_up 128x128"] > 0
    traced = counters["stats"]["unique_graphs"]
    assert traced >= 1
    images = generate_one(model, job_request(spec, width=128, height=128, steps=3)).images
    assert counters["stats"]["unique_graphs"] == traced and images[0].size == (128, 128)
