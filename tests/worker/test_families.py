"""Every family the README names runs on the worker: tiny random-weight SD3 and FLUX
pipelines (workers/tiny_flow.py), saved and loaded by the worker's own loader, generate
with every scheduler their family offers; a scheduler of another family is a 422 naming
`scheduler`; the few-step presets' defaults run as the catalog fills them in."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.catalog import CatalogError, _spec_from_table
from app.families import FAMILIES
from app.kinds import get_kind
from app.presets import PRESETS
from app.rules import SCHEDULERS, model_limit_errors, schedulers_for
from testbed.factories import generate_one, job_request
from workers.call import Interrupted, generate
from workers.pipelines import ModelLoadError, load_model, warm_up
from workers.tiny import build_tiny_model

FLOW = ("sd3", "flux")


def _spec(name: str, path, **table):
    values = {"path": str(path), "dtype": "float32", "default_width": 64, "default_height": 64}
    values.update({"max_width": 256, "max_height": 256, "max_pixels": 65536, **table})
    return _spec_from_table(name, values, path.parent)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {family: build_tiny_model(root / family, family=family) for family in FLOW}


@pytest.fixture(scope="module")
def models(paths):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    loaded = {}
    for family, path in paths.items():
        model = load_model(_spec(f"tiny-{family}", path, family=family), "cpu")
        assert type(model.pipeline).__name__ == {"sd3": "StableDiffusion3Pipeline"}.get(
            family, "FluxPipeline"
        )
        assert warm_up(model) > 0
        loaded[family] = model
    yield loaded
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("family", "scheduler"),
    [(family, name) for family in FLOW for name in schedulers_for(family)],
)
def test_each_scheduler_of_a_flow_family_generates(models, family, scheduler):
    model = models[family]
    assert model_limit_errors(model.spec, {"scheduler": scheduler}) == {}
    seen = []

    def on_step(step, total):
        seen.append((step, total))
        return True

    request = job_request(model.spec, scheduler=scheduler, steps=2, num_images=2, seed=3)
    output = generate_one(model, request, on_step=on_step)
    assert [image.size for image in output.images] == [(64, 64), (64, 64)]
    for image in output.images:
        pixels = np.asarray(image, dtype=np.float32)
        assert np.isfinite(pixels).all() and pixels.std() > 0
    assert seen[-1][0] == seen[-1][1] >= 2
    expected = SCHEDULERS[scheduler].class_name or "FlowMatchEulerDiscreteScheduler"
    assert type(output.scheduler).__name__ == expected
    assert model.pipeline.scheduler is model.scheduler
    again = generate_one(model, request)
    assert [i.tobytes() for i in again.images] == [i.tobytes() for i in output.images]


@pytest.mark.parametrize("family", FLOW)
def test_a_scheduler_of_another_family_is_a_422_naming_scheduler(models, family):
    spec = models[family].spec
    assert spec.schedulers == schedulers_for(family)
    for name, scheduler in SCHEDULERS.items():
        errors = model_limit_errors(spec, {"scheduler": name})
        if family in scheduler.families:
            assert errors == {}, name
        else:
            assert list(errors) == ["scheduler"], name
            assert f"family '{family}'" in errors["scheduler"][0]
    # The Stable Diffusion family is offered none of the flow-matching ones.
    sd = _spec("tiny", models[family].spec.path)
    assert "flow_euler" not in sd.schedulers and "ddim" in sd.schedulers
    assert list(model_limit_errors(sd, {"scheduler": "flow_euler"})) == ["scheduler"]


def test_the_catalog_refuses_what_a_family_cannot_run(paths):
    with pytest.raises(CatalogError, match=r"do not fit family 'flux'"):
        _spec("f", paths["flux"], family="flux", schedulers=["default", "ddim"])
    with pytest.raises(CatalogError, match=r"flow_heun.*do not fit family 'flux'"):
        _spec("f", paths["flux"], family="flux", schedulers=["flow_heun"])
    with pytest.raises(CatalogError, match=r"size_multiple must be a multiple of 16"):
        _spec("f", paths["flux"], family="flux", size_multiple=8, min_size=64)
    with pytest.raises(CatalogError, match=r"family must be one of"):
        _spec("f", paths["flux"], family="kandinsky")
    assert _spec("f", paths["flux"], family="flux").size_multiple == 16  # the family's own
    # A width that is no multiple of 16 is refused at submit, never failed on the GPU.
    errors = model_limit_errors(_spec("f", paths["flux"], family="flux"), {"width": 72})
    assert list(errors) == ["width"]


def test_a_model_whose_files_are_another_family_does_not_load(paths):
    with pytest.raises(ModelLoadError, match=r'FluxPipeline .* set family = "flux"'):
        load_model(_spec("f", paths["flux"]), "cpu")
    with pytest.raises(ModelLoadError, match=r'set family = "sd3"'):
        load_model(_spec("s", paths["sd3"], family="flux"), "cpu")


@pytest.mark.parametrize("family", FLOW)
def test_a_job_leaving_a_batched_call_leaves_the_others_running(models, family):
    model = models[family]
    first = job_request(model.spec, steps=3, seed=1)
    second = job_request(model.spec, steps=3, seed=2, prompt="a blue cube")
    alone = generate_one(model, second).images
    results = generate(model, [first, second], on_step=[lambda s, _: s < 1, lambda *_: True])
    assert results[0] is None
    assert [image.size for image in results[1].images] == [(64, 64)]
    difference = np.abs(
        np.asarray(results[1].images[0], dtype=np.float32) - np.asarray(alone[0], dtype=np.float32)
    )
    assert difference.max() <= 2  # the same job, batched or alone (float rounding apart)
    with pytest.raises(Interrupted):
        generate(model, [first, second], on_step=[lambda *_: False, lambda *_: False])


@pytest.mark.parametrize(
    ("family", "preset"), [("sd", "turbo"), ("sd", "lcm"), ("sd", "lightning"), ("flux", "schnell")]
)
def test_a_few_step_preset_fills_in_the_defaults_a_job_runs_with(
    models, paths, tiny_model, family, preset
):
    values = PRESETS[preset]
    if family == "sd":
        spec = _spec(f"tiny-{preset}", paths["flux"].parent / "sd", preset=preset)
        model = replace(tiny_model, spec=spec, kind_pipelines={})
    else:
        spec = _spec(f"tiny-{preset}", paths[family], family=family, preset=preset)
        model = replace(models[family], spec=spec)
    assert (spec.default_steps, spec.default_guidance) == (
        values["default_steps"],
        values["default_guidance"],
    )
    assert spec.max_steps == values["max_steps"]
    assert list(model_limit_errors(spec, {"steps": values["max_steps"] + 1})) == ["steps"]
    # What the API stores for a request that names neither steps nor guidance.
    request = get_kind("txt2img").normalize(spec, {"prompt": "a lighthouse", "seed": 5})
    assert (request.steps, request.guidance_scale) == (
        values["default_steps"],
        values["default_guidance"],
    )
    seen = []
    output = generate_one(model, request, on_step=lambda s, t: seen.append((s, t)) or True)
    assert seen[-1] == (values["default_steps"], values["default_steps"])
    assert [image.size for image in output.images] == [(64, 64)]
    # A key the table sets itself wins over the preset's.
    own = _spec("own", paths["flux"].parent / "sd", preset=preset, default_steps=2)
    assert own.default_steps == 2 and own.default_guidance == values["default_guidance"]


def test_every_family_is_in_the_table_and_the_readme():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for name in FAMILIES:
        assert f'family = "{name}"' in readme or f"`{name}`" in readme, name
    for name in PRESETS:
        assert f"`{name}`" in readme, name


@pytest.mark.parametrize("family", FLOW)
@pytest.mark.parametrize("kind", ["img2img", "inpaint"])
def test_image_to_image_and_inpainting_run_on_a_flow_family_at_the_inputs_size(
    models, family, kind
):
    from PIL import Image

    from app.kinds.images import InputRef

    model = models[family]
    rng = np.random.default_rng(4)
    image = Image.fromarray(rng.integers(0, 255, (64, 96, 3), dtype=np.uint8))
    mask = Image.new("L", image.size, 0)
    mask.paste(255, (32, 16, 64, 48))
    refs = {"image": InputRef("a" * 64, *image.size, "RGB")}
    inputs = {"image": image}
    if kind == "inpaint":
        refs["mask"] = InputRef("b" * 64, *image.size, "L")
        inputs["mask"] = mask
    request = get_kind(kind).normalize(
        model.spec, {"prompt": "a fox", "steps": 3, "seed": 2, **refs}
    )
    [output] = generate(model, [request], on_step=[lambda *_: True], inputs=[inputs])
    # FLUX's image-to-image makes its default 1024² unless told the size: it is told.
    assert [made.size for made in output.images] == [(96, 64)]
