"""The video families on the worker: tiny random-weight Wan (text to video, and its own
image-to-video model) and LTX-Video (both kinds on one model) pipelines, saved and loaded
by the worker's own loader, warmed up by their first kind, run through the one pipeline
call with every scheduler their family offers; per-step progress counts the steps; a
stop at a step ends the call with nothing decoded; each family's frame and size rules
are refused at submit, never failed on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from app.catalog import CatalogError, _spec_from_table
from app.kinds import get_kind
from app.kinds.images import InputRef
from app.rules import model_limit_errors, schedulers_for
from workers.call import Interrupted, generate
from workers.pipelines import ModelLoadError, load_model, warm_up
from workers.tiny import build_tiny_model

VIDEO = {
    # name: (family, build keywords, catalog table)
    "wan": ("wan", {}, {}),
    "wan-i2v": ("wan", {"image_to_video": True}, {"kinds": ["img2vid"]}),
    "ltx": ("ltx", {}, {"min_size": 32}),
}


def _spec(name: str, path, family: str, **table):
    values = {
        "path": str(path),
        "family": family,
        "dtype": "float32",
        "default_width": 64,
        "default_height": 64,
        "max_width": 128,
        "max_height": 128,
        "max_pixels": 16384,
        "default_steps": 2,
        "default_frames": 9,
        "max_frames": 17,
        **table,
    }
    return _spec_from_table(name, values, path.parent)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import torch

    root = tmp_path_factory.mktemp("video-families")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    loaded = {}
    for name, (family, build, table) in VIDEO.items():
        path = build_tiny_model(root / name, family=family, **build)
        model = load_model(_spec(name, path, family, **table), "cpu")
        assert warm_up(model) > 0  # the model's first kind, at its fewest steps
        loaded[name] = model
    yield loaded
    torch.set_num_threads(threads)


def _request(model, kind: str, **fields):
    data = {"prompt": "a tiny clip", "seed": 5, "steps": 2, "num_frames": 9, **fields}
    data.setdefault("width", 64)
    data.setdefault("height", 64)
    inputs = {}
    if kind == "img2vid":
        data["image"] = InputRef("first", 80, 48, "RGB")
        inputs = {"image": Image.new("RGB", (80, 48), (200, 30, 30))}
    return get_kind(kind).normalize(model.spec, data), inputs


def _cases():
    for name, (family, _build, table) in VIDEO.items():
        kinds = table.get("kinds") or (["txt2vid", "img2vid"] if family == "ltx" else ["txt2vid"])
        for kind in kinds:
            for scheduler in schedulers_for(family):
                yield name, kind, scheduler


@pytest.mark.parametrize(("name", "kind", "scheduler"), list(_cases()))
def test_each_video_model_makes_a_clip_with_each_scheduler(models, name, kind, scheduler):
    model = models[name]
    request, inputs = _request(model, kind, scheduler=scheduler)
    seen: list[tuple[int, int]] = []
    (output,) = generate(
        model, [request], on_step=[lambda s, t: seen.append((s, t)) or True], inputs=[inputs]
    )
    (clip,) = output.images
    assert clip.shape == (9, 64, 64, 3) and clip.dtype == np.float32
    assert np.isfinite(clip).all() and clip.std() > 0
    assert seen == [(1, 2), (2, 2)]  # progress per denoising step
    assert model.pipeline.scheduler is model.scheduler  # the call's own scheduler went back
    (again,) = generate(model, [request], on_step=[lambda *_: True], inputs=[inputs])
    assert np.array_equal(again.images[0], clip)  # the seed decides the clip


@pytest.mark.parametrize("name", list(VIDEO))
def test_a_stop_at_a_step_ends_the_call_before_the_decode(models, name):
    model = models[name]
    kind = model.spec.kinds[0]
    request, inputs = _request(model, kind, steps=6)
    seen: list[int] = []

    def on_step(step, _total):
        seen.append(step)
        return step < 2  # a cancel seen at step 2

    with pytest.raises(Interrupted):
        generate(model, [request], on_step=[on_step], inputs=[inputs])
    assert seen == [1, 2]


def test_a_first_frame_gives_the_clip_its_shape_fitted_to_the_family(models):
    kind = get_kind("img2vid")
    frame = {"image": InputRef("first", 112, 64, "RGB")}
    assert kind.default_size(models["wan-i2v"].spec, frame) == (112, 64)  # multiples of 16
    assert kind.default_size(models["ltx"].spec, frame) == (96, 64)  # multiples of 32


def test_each_familys_rules_are_refused_at_submit(models):
    wan, ltx = models["wan"].spec, models["ltx"].spec
    kind = get_kind("txt2vid")
    assert list(kind.limit_errors(wan, {"num_frames": 11})) == ["num_frames"]  # not 4k + 1
    assert kind.limit_errors(wan, {"num_frames": 13}) == {}
    assert list(kind.limit_errors(ltx, {"num_frames": 13})) == ["num_frames"]  # not 8k + 1
    assert list(kind.limit_errors(ltx, {"num_frames": 25})) == ["num_frames"]  # past max
    assert list(model_limit_errors(wan, {"width": 72})) == ["width"]  # multiple of 16
    assert list(model_limit_errors(ltx, {"width": 80})) == ["width"]  # multiple of 32
    assert list(model_limit_errors(ltx, {"steps": 1})) == ["steps"]  # LTX needs two
    assert model_limit_errors(wan, {"steps": 1}) == {}
    assert list(model_limit_errors(wan, {"scheduler": "flow_euler"})) == ["scheduler"]


def test_the_catalog_refuses_what_a_video_model_cannot_run(models):
    path = models["ltx"].spec.path
    with pytest.raises(CatalogError, match=r"cannot offer the kinds \['txt2img'\]"):
        _spec("v", path, "ltx", kinds=["txt2img", "txt2vid"])
    with pytest.raises(CatalogError, match=r"default_frames must be k x 8 \+ 1"):
        _spec("v", path, "ltx", default_frames=12)
    with pytest.raises(CatalogError, match=r"max_batch = 1"):
        _spec("v", path, "ltx", max_batch=4)
    with pytest.raises(CatalogError, match=r"cannot offer the kinds \['txt2vid'\]"):
        _spec_from_table("i", {"path": str(path), "kinds": ["txt2vid"]}, path.parent)


def test_a_wan_model_listed_as_ltx_does_not_load(models):
    with pytest.raises(ModelLoadError, match=r'set family = "wan"'):
        load_model(_spec("w", models["wan"].spec.path, "ltx", min_size=32), "cpu")


def _tier_cases():
    for name, (family, _build, table) in VIDEO.items():
        kinds = table.get("kinds") or (["txt2vid", "img2vid"] if family == "ltx" else ["txt2vid"])
        for kind in kinds:
            yield name, kind


@pytest.mark.parametrize(("name", "kind"), list(_tier_cases()))
def test_each_video_model_runs_every_quality_tier_it_offers(models, name, kind):
    """A video model's tiers (app/quality.py: First Block Cache on the transformer; Wan's
    fast tier also cuts its separate guidance pass) make a clip of the same shape, and
    the manifest says what each applied."""
    model = models[name]
    made = {}
    for tier in model.spec.quality:
        request, inputs = _request(model, kind, steps=4, quality=tier, guidance_scale=5.0)
        (output,) = generate(model, [request], on_step=[lambda *_: True], inputs=[inputs])
        (clip,) = output.images
        assert clip.shape == (9, 64, 64, 3) and np.isfinite(clip).all(), tier
        made[tier] = output.quality
    assert made["exact"] == {"tier": "exact"}
    assert made["fast"]["step_cache"] == "first_block"
    assert not model.pipeline.transformer.is_cache_enabled  # taken off after each call
    if model.spec.family == "wan":
        assert made["fast"]["guided_steps"] == 2  # 0.6 of 4 steps, then the conditional alone
