"""Quality tiers through the worker's one call (CPU, tiny models): each tier does what its
settings say and no more, and nothing of it outlives its call.

- SD (a UNet that guides in batched rows): `fast` cuts guidance after half the steps, so
  the UNet is fed fewer rows (counted), and the image differs from `exact`'s; each tier
  repeats byte for byte; an `exact` call after a `fast` one gives `exact`'s bytes; no
  guidance (scale 1) leaves nothing to cut, and the manifest says so; image-to-image and
  inpainting (whose mask rows are guided too) cut alike; a batch with a job leaving after
  the cut goes on.
- FLUX (a transformer with diffusers' step caches): First Block Cache and TaylorSeer skip
  attention work (counted), on text to image and on image to image (whose pipeline names
  no cache context), and the cache is taken off after the call.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from PIL import Image

from app.kinds import KINDS
from app.kinds.images import InputRef
from workers.call import generate

SIZE = (64, 64)


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _inputs(kind: str) -> tuple[dict, dict]:
    refs, inputs = {}, {}
    if kind != "txt2img":
        refs["image"] = InputRef("a" * 64, *SIZE, "RGB")
        inputs["image"] = Image.new("RGB", SIZE, (90, 140, 200))
    if kind == "inpaint":
        mask = Image.new("L", SIZE, 0)
        mask.paste(255, (16, 16, 48, 48))
        refs["mask"], inputs["mask"] = InputRef("b" * 64, *SIZE, "L"), mask
    return refs, inputs


def _run(model, quality: str, kind: str = "txt2img", **fields) -> SimpleNamespace:
    refs, inputs = _inputs(kind)
    data = {"prompt": "a red fox", "seed": 3, "steps": 8, "quality": quality, **fields}
    job = KINDS[kind].normalize(model.spec, {**data, **refs})
    [out] = generate(model, [job], on_step=[lambda *_: True], inputs=[inputs])
    return SimpleNamespace(png=_png(out.images[0]), applied=out.quality)


@pytest.fixture
def unet_rows(tiny_model):
    """The sample rows the tiny model's UNet is fed, summed over a call's steps."""
    fed = []
    handle = tiny_model.pipeline.unet.register_forward_pre_hook(
        lambda _m, args: fed.append(args[0].shape[0])
    )
    yield fed
    handle.remove()


def test_fast_cuts_guidance_after_half_the_steps_and_nothing_outlives_the_call(
    tiny_model, unet_rows
):
    exact = _run(tiny_model, "exact")
    exact_rows = sum(unet_rows)
    unet_rows.clear()
    fast = _run(tiny_model, "fast")
    fast_rows = sum(unet_rows)
    again = [_run(tiny_model, "exact"), _run(tiny_model, "fast")]
    print(f"UNet rows over 8 steps: exact {exact_rows}, fast {fast_rows}")
    assert exact_rows == 2 * 8  # guided: an unconditional and a conditional row a step
    assert fast_rows == 2 * 4 + 4  # guided for half the steps, conditional alone after
    assert fast.applied == {"tier": "fast", "guidance_until": 0.5, "guided_steps": 4}
    assert exact.applied == {"tier": "exact"}
    assert fast.png != exact.png
    assert [again[0].png, again[1].png] == [exact.png, fast.png]


def test_balanced_sits_between_exact_and_fast(tiny_model):
    balanced = _run(tiny_model, "balanced")
    assert balanced.applied == {"tier": "balanced", "guidance_until": 0.8, "guided_steps": 6}
    assert balanced.png not in (_run(tiny_model, "exact").png, _run(tiny_model, "fast").png)


def test_without_guidance_there_is_nothing_to_cut(tiny_model, unet_rows):
    fast = _run(tiny_model, "fast", guidance_scale=1.0)
    exact = _run(tiny_model, "exact", guidance_scale=1.0)
    assert fast.applied == {"tier": "fast"}  # the manifest does not claim a cut
    assert fast.png == exact.png
    assert sum(unet_rows) == 2 * 8  # one conditional row a step, both calls


@pytest.mark.parametrize("kind", ["img2img", "inpaint"])
def test_image_kinds_cut_their_guided_rows_alike(tiny_model, kind):
    fast = _run(tiny_model, "fast", kind)
    exact = _run(tiny_model, "exact", kind)
    assert fast.applied["guidance_until"] == 0.5
    assert fast.png != exact.png
    assert _run(tiny_model, "fast", kind).png == fast.png


def test_a_batch_goes_on_when_a_job_leaves_after_the_cut(tiny_model):
    jobs = [
        KINDS["txt2img"].normalize(
            tiny_model.spec, {"prompt": p, "seed": 5, "steps": 8, "quality": "fast"}
        )
        for p in ("a red fox", "a blue jay")
    ]
    [kept, left] = generate(
        tiny_model, jobs, on_step=[lambda *_: True, lambda step, _total: step < 6]
    )
    assert left is None
    assert kept.quality["guided_steps"] == 4 and len(kept.images) == 1


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    """The tiny FLUX model as the worker loads it, balanced on TaylorSeer and fast on
    First Block Cache at a threshold its random weights cross (the family's 0.16 is
    never crossed by them: each tier would run in full)."""
    from app.catalog import _spec_from_table
    from workers.pipelines import load_model
    from workers.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("flux-tiers")
    table = {
        "path": str(build_tiny_model(root / "flux", family="flux")),
        "family": "flux",
        "dtype": "float32",
        "default_width": 64,
        "default_height": 64,
        "max_pixels": 16384,
        "tiers": {
            "balanced": {"step_cache": "taylorseer", "interval": 2},
            "fast": {"threshold": 0.5},
        },
    }
    return load_model(_spec_from_table("tiny-flux", table, root), "cpu")


@pytest.fixture
def attention_runs(flux):
    """Attention projections run in the FLUX transformer's blocks (a skipped block or a
    predicted attention runs none)."""
    runs = []
    handles = [
        module.register_forward_pre_hook(lambda *_: runs.append(1))
        for name, module in flux.pipeline.transformer.named_modules()
        if name.endswith("attn.to_q")
    ]
    yield runs
    for handle in handles:
        handle.remove()


@pytest.mark.parametrize("kind", ["txt2img", "img2img"])
def test_step_caches_skip_work_on_flux_and_come_off_after_the_call(flux, attention_runs, kind):
    exact = _run(flux, "exact", kind)
    full = len(attention_runs)
    counts = {}
    made = {}
    for tier in ("balanced", "fast"):
        attention_runs.clear()
        made[tier] = _run(flux, tier, kind)
        counts[tier] = len(attention_runs)
    print(
        f"{kind}: attention runs exact {full}, balanced {counts['balanced']}, fast {counts['fast']}"
    )
    assert made["balanced"].applied == {
        "tier": "balanced",
        "step_cache": "taylorseer",
        "interval": 2,
    }
    assert made["fast"].applied == {"tier": "fast", "step_cache": "first_block", "threshold": 0.5}
    assert counts["balanced"] < full and counts["fast"] < full
    assert made["balanced"].png != exact.png and made["fast"].png != exact.png
    attention_runs.clear()
    assert _run(flux, "exact", kind).png == exact.png
    assert len(attention_runs) == full  # the cache's hooks are gone
    assert not flux.pipeline.transformer.is_cache_enabled


def test_a_step_cache_the_denoiser_cannot_take_stops_the_load():
    """First Block Cache needs a head block and a tail block: a transformer of one block
    is refused when the model loads (workers/pipelines.py turns this into the
    ModelLoadError that stops the worker), not when a job asks for the tier."""
    from diffusers import LTXVideoTransformer3DModel

    from app.quality import Tier
    from workers.tiers import TierUnavailable, check_tiers

    one_block = LTXVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        num_layers=1,
        caption_channels=16,
    )
    pipeline = SimpleNamespace(transformer=one_block)
    fast = Tier("fast", step_cache="first_block", threshold=0.1)
    with pytest.raises(TierUnavailable, match="tier fast: first_block cannot be put"):
        check_tiers(pipeline, (Tier("exact"), fast))
    check_tiers(pipeline, (Tier("exact"), Tier("fast", step_cache="taylorseer", interval=2)))
    assert not one_block.is_cache_enabled
