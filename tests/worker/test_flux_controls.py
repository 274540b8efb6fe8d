"""ControlNet conditioning on a FLUX model (CPU), through the worker's one call: the tiny
FLUX pipeline saved and loaded by the worker's own loader, its ControlNets loaded by the
worker's cache from directories (`diffq model build-tiny-controlnet --family flux`). A
control steers the image and repeats byte for byte, on text to image, image to image and
inpainting, one control or two; an SD ControlNet is refused by the worker as a second
line to the catalog's family check."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from PIL import Image

from app.addons.controlnet.control import Control, ControlNetSpec, input_field
from app.catalog import _spec_from_table
from app.kinds import KINDS
from app.kinds.images import InputRef
from workers.call import generate

SIZE = (64, 64)


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    """The tiny FLUX model as a worker loads it, with two FLUX ControlNets and an SD one
    in its worker's catalog."""
    from workers.pipelines import load_model
    from workers.tiny import build_tiny_controlnet, build_tiny_model

    root = tmp_path_factory.mktemp("flux-controls")
    path = build_tiny_model(root / "flux", family="flux")
    table = {"path": str(path), "family": "flux", "lora_family": "tiny-flux", "dtype": "float32"}
    table.update(default_width=64, default_height=64, max_width=128, max_height=128)
    spec = _spec_from_table("tiny-flux", {**table, "max_pixels": 16384}, root)
    specs = {
        "edges": ControlNetSpec("edges", build_tiny_controlnet(root / "a", 1, "flux"), "tiny-flux"),
        "other": ControlNetSpec("other", build_tiny_controlnet(root / "b", 2, "flux"), "tiny-flux"),
        "sd": ControlNetSpec("sd", build_tiny_controlnet(root / "sd", 1), "tiny-flux"),  # a lie
    }
    rt = SimpleNamespace(
        catalog=SimpleNamespace(controlnets=specs),
        settings=SimpleNamespace(worker_controlnets=4, worker_controlnet_bytes=1 << 40),
    )
    return SimpleNamespace(model=load_model(spec, "cpu"), spec=spec, rt=rt)


def _square(box=(16, 16, 48, 48)) -> Image.Image:
    image = Image.new("RGB", SIZE, (0, 0, 0))
    image.paste((255, 255, 255), box)
    return image


def _run(flux, kind="txt2img", controls=(), images=()) -> bytes:
    from app.addons.controlnet.worker import controlnets_for

    refs, inputs = {}, {}
    if kind != "txt2img":
        refs["image"], inputs["image"] = (
            InputRef("a" * 64, *SIZE, "RGB"),
            Image.new("RGB", SIZE, (90, 140, 200)),
        )
    if kind == "inpaint":
        refs["mask"], inputs["mask"] = InputRef("b" * 64, *SIZE, "L"), _square().convert("L")
    stored = []
    for index, (control, image) in enumerate(zip(controls, images, strict=True)):
        stored.append({"image": f"{index:064d}", **control})
        inputs[input_field(index)] = image
    data = {"prompt": "a red fox", "seed": 3, "steps": 2, "controls": stored}
    job = KINDS[kind].normalize(flux.spec, {**data, **refs})
    modules = controlnets_for(flux.rt, flux.model, job.controls)
    [out] = generate(
        flux.model, [job], on_step=[lambda *_: True], inputs=[inputs], addons={"controls": modules}
    )
    buffer = io.BytesIO()
    out.images[0].save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("kind", ["txt2img", "img2img", "inpaint"])
def test_a_control_steers_a_flux_image_and_repeats_on_every_image_kind(flux, kind):
    plain = _run(flux, kind)
    edges = [{"controlnet": "edges"}]
    square = _run(flux, kind, controls=edges, images=[_square()])
    again = _run(flux, kind, controls=edges, images=[_square()])
    moved = _run(flux, kind, controls=edges, images=[_square(box=(0, 0, 24, 24))])
    assert square != plain
    assert square == again
    assert moved != square
    pipeline = flux.model.kind_pipelines[(kind, "edges")]
    assert type(pipeline).__name__.startswith("FluxControlNet"), type(pipeline).__name__


@pytest.mark.parametrize("kind", ["txt2img", "inpaint"])
def test_two_flux_controls_run_together(flux, kind):
    one = _run(flux, kind, controls=[{"controlnet": "edges"}], images=[_square()])
    both = _run(
        flux,
        kind,
        controls=[{"controlnet": "edges"}, {"controlnet": "other", "scale": 0.5}],
        images=[_square(), _square(box=(0, 0, 24, 24))],
    )
    assert both != one
    assert type(flux.model.kind_pipelines[(kind, "edges", "other")].controlnet).__name__ == (
        "FluxMultiControlNetModel"
    )


def test_an_sd_controlnet_is_refused_by_a_flux_worker_naming_its_class(flux):
    from app.addons.controlnet.worker import ControlNetMissing, controlnets_for

    with pytest.raises(ControlNetMissing, match="is a ControlNetModel; model 'tiny-flux'"):
        controlnets_for(flux.rt, flux.model, [Control("sd", "0" * 64)])
