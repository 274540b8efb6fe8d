"""Image to image and inpainting on the tiny model (CPU), through the worker's one call:
strength runs the steps it leaves, the output is the input's size, every pixel outside an
inpainting's mask is the input's own (whole picture and masked only), compatible jobs
batch with different inputs, and a dedicated inpainting model (9-channel UNet) runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFilter

from app.catalog import tiny_spec
from app.kinds import KINDS
from app.kinds.images import InputRef
from workers.call import generate
from workers.pipelines import LoadedModel, warm_up

SPEC = tiny_spec(Path("/models/tiny"))


def _picture(seed: int, size=(128, 96)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))


def _mask(size=(128, 96), box=(40, 30, 80, 60)) -> Image.Image:
    mask = Image.new("L", size, 0)
    mask.paste(255, box)
    return mask


def _request(kind: str, image: Image.Image, **fields):
    refs = {"image": InputRef("a" * 64, *image.size, "RGB")}
    if kind == "inpaint":
        refs["mask"] = InputRef("b" * 64, *image.size, "L")
    return KINDS[kind].normalize(SPEC, {"prompt": "a red fox", "seed": 1, **refs, **fields})


@pytest.mark.parametrize(("strength", "steps"), [(0.5, 8), (0.25, 8), (1.0, 4)])
def test_strength_runs_the_steps_it_leaves_at_the_inputs_size(tiny_model, strength, steps):
    image = _picture(0)
    job = _request("img2img", image, strength=strength, steps=steps)
    seen = []
    [out] = generate(
        tiny_model,
        [job],
        on_step=[lambda s, t: seen.append((s, t)) or True],
        inputs=[{"image": image}],
    )
    print(f"strength {strength} of {steps} steps: progress {seen}")
    assert job.denoise_steps == int(steps * strength)
    assert seen == [(s, job.denoise_steps) for s in range(1, job.denoise_steps + 1)]
    assert out.images[0].size == image.size == (job.width, job.height)


def test_the_input_and_the_strength_make_the_image(tiny_model):
    """The same request gives the same bytes; another input or strength, another image.
    (Random weights decode to noise whatever the input: how close the image stays to
    the input is a real model's property, not this one's.)"""
    first, second = _picture(1), _picture(2)

    def made(image, strength):
        job = _request("img2img", image, strength=strength, steps=8)
        [out] = generate(tiny_model, [job], on_step=[lambda *_: True], inputs=[{"image": image}])
        return out.images[0].tobytes()

    assert made(first, 0.5) == made(first, 0.5)
    assert made(first, 0.5) != made(second, 0.5)
    assert made(first, 0.5) != made(first, 0.75)


@pytest.mark.parametrize("masked_only", [False, True])
def test_pixels_outside_the_mask_are_the_inputs_own(tiny_model, masked_only):
    image, mask = _picture(2), _mask()
    job = _request("inpaint", image, steps=4, masked_only=masked_only, mask_blur=4)
    [out] = generate(
        tiny_model, [job], on_step=[lambda *_: True], inputs=[{"image": image, "mask": mask}]
    )
    made, base = np.asarray(out.images[0]), np.asarray(image)
    untouched = np.asarray(mask.filter(ImageFilter.GaussianBlur(4))) == 0
    changed = np.mean(made[~untouched] != base[~untouched])
    equal = bool((made[untouched] == base[untouched]).all())
    print(f"masked_only={masked_only}: outside equal {equal}, inside changed {changed:.2f}")
    assert made.shape == base.shape
    assert (made[untouched] == base[untouched]).all()
    assert changed > 0.5  # the masked part was redrawn


def test_img2img_jobs_with_different_inputs_share_one_call(tiny_model, monkeypatch):
    first, second = _picture(3), _picture(4)
    jobs = [_request("img2img", first, seed=5), _request("img2img", second, seed=6, num_images=2)]
    decodes: list[int] = []  # the batch size of each VAE decode
    vae = tiny_model.pipeline.vae
    decode = vae.decode
    monkeypatch.setattr(
        vae,
        "decode",
        lambda latents, *a, **k: decodes.append(len(latents)) or decode(latents, *a, **k),
    )
    together = generate(
        tiny_model,
        jobs,
        on_step=[lambda *_: True] * 2,
        inputs=[{"image": first}, {"image": second}],
    )
    assert decodes == [3]  # one call, one row per image
    assert [len(out.images) for out in together] == [1, 2]
    alone = generate(tiny_model, jobs[:1], on_step=[lambda *_: True], inputs=[{"image": first}])
    difference = np.abs(
        np.asarray(alone[0].images[0], dtype=int) - np.asarray(together[0].images[0], dtype=int)
    )
    print(f"alone vs batched: max level difference {difference.max()}")
    assert difference.max() <= 2  # the same image, up to kernels' summation order


def test_a_dedicated_inpainting_model_runs_and_warms_up_inpainting():
    from dataclasses import replace

    from workers.tiny import build_tiny_pipeline

    pipeline = build_tiny_pipeline(0, inpainting=True)
    pipeline.set_progress_bar_config(disable=True)
    assert pipeline.unet.config.in_channels == 9
    model = LoadedModel(replace(SPEC, kinds=("inpaint",)), pipeline, "cpu", 0.0)
    assert warm_up(model) > 0
    image, mask = _picture(5), _mask()
    job = _request("inpaint", image, steps=3)
    [out] = generate(
        model, [job], on_step=[lambda *_: True], inputs=[{"image": image, "mask": mask}]
    )
    untouched = np.asarray(mask.filter(ImageFilter.GaussianBlur(4))) == 0
    made, base = np.asarray(out.images[0]), np.asarray(image)
    assert (made[untouched] == base[untouched]).all()
    assert model.kind_pipelines["inpaint"] is pipeline  # its own pipeline: no second object
