"""ControlNet conditioning on the tiny model (CPU), through the worker's one call: a
control image steers the image and the same one gives the same bytes, its scale and its
span reach the pipeline, canny edges are what the ControlNet sees, several controls run
together, and image-to-image and inpainting take controls as text-to-image does."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.addons.controlnet.control import input_field, preprocessed
from app.catalog import tiny_spec
from app.kinds import KINDS
from app.kinds.images import InputRef
from workers.call import generate

SPEC = tiny_spec(Path("/models/tiny"))
SIZE = (64, 64)


@pytest.fixture(scope="module")
def controlnets():
    from workers.tiny import tiny_controlnet

    return {"edges": tiny_controlnet(seed=1), "other": tiny_controlnet(seed=2)}


def _square(fill=(255, 255, 255), box=(16, 16, 48, 48)) -> Image.Image:
    image = Image.new("RGB", SIZE, (0, 0, 0))
    image.paste(fill, box)
    return image


def _run(model, controlnets, kind="txt2img", controls=(), images=(), **fields) -> bytes:
    refs, inputs = {}, {}
    if kind != "txt2img":
        picture = Image.new("RGB", SIZE, (90, 140, 200))
        refs["image"], inputs["image"] = InputRef("a" * 64, *SIZE, "RGB"), picture
    if kind == "inpaint":
        refs["mask"], inputs["mask"] = InputRef("b" * 64, *SIZE, "L"), _square().convert("L")
    stored = []
    for index, (control, image) in enumerate(zip(controls, images, strict=True)):
        stored.append({"image": f"{index:064d}", **control})
        inputs[input_field(index)] = image
    data = {"prompt": "a red fox", "seed": 3, "steps": 3, "controls": stored}
    job = KINDS[kind].normalize(SPEC, {**data, **refs, **fields})
    [out] = generate(
        model, [job], on_step=[lambda *_: True], inputs=[inputs], addons={"controls": controlnets}
    )
    buffer = io.BytesIO()
    out.images[0].save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_control_image_steers_the_image_and_the_same_one_gives_the_same_bytes(
    tiny_model, controlnets
):
    plain = _run(tiny_model, controlnets)
    edges = [{"controlnet": "edges"}]
    square = _run(tiny_model, controlnets, controls=edges, images=[_square()])
    again = _run(tiny_model, controlnets, controls=edges, images=[_square()])
    moved = _run(tiny_model, controlnets, controls=edges, images=[_square(box=(0, 0, 24, 24))])
    assert square != plain
    assert square == again
    assert moved != square


def test_scale_and_span_reach_the_pipeline(tiny_model, controlnets):
    plain = _run(tiny_model, controlnets)
    image = [_square()]
    full = _run(tiny_model, controlnets, controls=[{"controlnet": "edges"}], images=image)
    off = _run(
        tiny_model, controlnets, controls=[{"controlnet": "edges", "scale": 0.0}], images=image
    )
    late = _run(
        tiny_model, controlnets, controls=[{"controlnet": "edges", "start": 0.5}], images=image
    )
    half = _run(
        tiny_model, controlnets, controls=[{"controlnet": "edges", "scale": 0.5}], images=image
    )
    assert off == plain  # a scale of 0 adds nothing
    assert len({plain, full, late, half}) == 4


def test_canny_gives_the_controlnet_edges_of_the_image(tiny_model, controlnets):
    photo = _square(fill=(200, 60, 30))
    edges = preprocessed(photo, "canny", *SIZE)
    pixels = np.asarray(edges)
    print(f"canny: {int((pixels > 0).any(axis=2).sum())} edge pixels of {SIZE[0] * SIZE[1]}")
    assert set(np.unique(pixels)) == {0, 255}  # a binary edge map, RGB
    assert pixels[32, 32].tolist() == [0, 0, 0]  # inside the square: no edge
    assert pixels[16, 16:48].any() and pixels[16:48, 16].any()  # its outline
    canny = [{"controlnet": "edges", "preprocess": "canny"}]
    none = [{"controlnet": "edges"}]
    assert _run(tiny_model, controlnets, controls=canny, images=[photo]) != _run(
        tiny_model, controlnets, controls=none, images=[photo]
    )
    assert _run(tiny_model, controlnets, controls=canny, images=[photo]) == _run(
        tiny_model, controlnets, controls=none, images=[edges]
    )


def test_two_controls_run_together(tiny_model, controlnets):
    one = _run(tiny_model, controlnets, controls=[{"controlnet": "edges"}], images=[_square()])
    both = _run(
        tiny_model,
        controlnets,
        controls=[{"controlnet": "edges"}, {"controlnet": "other", "scale": 0.7}],
        images=[_square(), _square(box=(0, 0, 32, 64))],
    )
    assert both != one
    twice = _run(
        tiny_model,
        controlnets,
        controls=[{"controlnet": "edges"}, {"controlnet": "edges", "scale": 0.5}],
        images=[_square(), _square(box=(0, 0, 32, 64))],
    )  # one ControlNet named by two controls: a MultiControlNet of it twice
    assert twice not in (one, both)


@pytest.mark.parametrize("kind", ["img2img", "inpaint"])
def test_image_to_image_and_inpainting_take_controls(tiny_model, controlnets, kind):
    fields = {"strength": 1.0}
    plain = _run(tiny_model, controlnets, kind=kind, **fields)
    steered = _run(
        tiny_model,
        controlnets,
        kind=kind,
        controls=[{"controlnet": "edges"}],
        images=[_square()],
        **fields,
    )
    assert steered != plain


def test_a_worker_loads_catalog_controlnets_once_keeps_a_few_bounded_in_count_and_bytes(
    tmp_path, tiny_pipeline
):
    from types import SimpleNamespace

    import torch
    from diffusers import ControlNetModel

    from app.addons.controlnet.control import Control, ControlNetSpec
    from app.addons.controlnet.worker import ControlNetMissing, controlnets_for
    from workers.pipelines import LoadedModel
    from workers.tiny import build_tiny_controlnet

    build_tiny_controlnet(tmp_path / "a", seed=1)
    build_tiny_controlnet(tmp_path / "b", seed=2)
    shape = dict(ControlNetModel.from_unet(tiny_pipeline.unet).config)
    wide = ControlNetModel.from_config({**shape, "cross_attention_dim": 64})  # another family's
    wide.save_pretrained(tmp_path / "wide")
    specs = {
        name: ControlNetSpec(name, tmp_path / folder, "tiny")
        for name, folder in [("a", "a"), ("b", "b"), ("wide", "wide"), ("gone", "gone")]
    }
    rt = SimpleNamespace(
        catalog=SimpleNamespace(controlnets=specs),
        settings=SimpleNamespace(worker_controlnets=1, worker_controlnet_bytes=1 << 40),
    )
    model = LoadedModel(SPEC, tiny_pipeline, "cpu", 0.0)

    def named(*names):
        return [Control(name, "0" * 64) for name in names]

    first = controlnets_for(rt, model, named("a", "a"))
    assert list(first) == ["a"] and first["a"].dtype == torch.float32
    assert controlnets_for(rt, model, named("a"))["a"] is first["a"]  # loaded once
    model.kind_pipelines[("txt2img", "a")] = object()
    controlnets_for(rt, model, named("b"))  # one kept: "a" and its pipelines go
    assert list(model.controlnets) == ["b"] and ("txt2img", "a") not in model.kind_pipelines
    refusals = [("gone", "did not load"), ("wide", "cross_attention_dim is 64"), ("x", "catalog")]
    for name, said in refusals:
        with pytest.raises(ControlNetMissing, match=said):
            controlnets_for(rt, model, named(name))
    # Bounded in bytes too: with room for four by count but not for two by bytes, the
    # least recent goes, and a job's own ControlNets are loaded whatever their size.
    size = sum(p.numel() * p.element_size() for p in model.controlnets.get("b").parameters())
    rt.settings.worker_controlnets, rt.settings.worker_controlnet_bytes = 4, size + size // 2
    controlnets_for(rt, model, named("a"))
    assert list(model.controlnets) == ["a"] and model.controlnets.bytes == size
    rt.settings.worker_controlnet_bytes = 3 * size
    controlnets_for(rt, model, named("b"))
    assert list(model.controlnets) == ["a", "b"] and model.controlnets.bytes == 2 * size
