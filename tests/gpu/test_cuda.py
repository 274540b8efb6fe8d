"""The tiny model on a real CUDA device in half precision (skipped where there is none)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip(
        "no CUDA device visible to torch (torch.cuda.is_available() is False); "
        "run on a GPU machine to check fp16 generation",
        allow_module_level=True,
    )


def test_the_tiny_model_generates_in_fp16_on_cuda_reproducibly(tmp_path):
    from dataclasses import replace

    from app.catalog import tiny_spec
    from testbed.factories import generate_one, job_request
    from workers.pipelines import load_model, warm_up
    from workers.tiny import build_tiny_model

    spec = replace(tiny_spec(build_tiny_model(tmp_path / "tiny")), dtype="float16")
    model = load_model(spec, "cuda")
    assert model.pipeline.unet.dtype == torch.float16
    assert model.pipeline.device.type == "cuda"
    warm_up(model)
    request = job_request(
        spec,
        prompt="a red fox",
        width=128,
        height=128,
        steps=8,
        guidance_scale=7.5,
        seed=7,
        num_images=2,
        scheduler="euler",
    )
    steps_seen = []

    def on_step(step, total):
        steps_seen.append((step, total))
        return True

    first = generate_one(model, request, on_step=on_step).images
    second = generate_one(model, request).images
    assert [image.size for image in first] == [(128, 128), (128, 128)]
    assert steps_seen[-1] == (8, 8)
    assert [im.tobytes() for im in first] == [im.tobytes() for im in second]
    # Half precision that overflows gives NaN latents, decoded as flat black images; a
    # different seed must give a different image.
    for image in first:
        low, high = image.convert("L").getextrema()
        assert high > low, "a flat image: the fp16 run produced no picture"
    other = generate_one(model, replace(request, seed=100)).images
    assert other[0].tobytes() != first[0].tobytes()
