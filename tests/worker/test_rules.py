"""What the API accepts, the worker runs: every scheduler of app/rules.py's table and
every edge of the tiny model's limits, as the API normalizes them, generate and encode on
the tiny model; one step past each edge is refused at submit (a 422, never a dead letter).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.catalog import tiny_spec
from app.kinds import KINDS
from app.rules import MAX_SEED, OUTPUT_FORMATS, SCHEDULERS, model_limit_errors, schedulers_for
from testbed.factories import generate_one, job_request
from workers.call import job_scheduler
from workers.encoding import encode_image

SPEC = tiny_spec(Path("/models/tiny"))


def test_every_scheduler_in_the_table_is_a_class_the_worker_builds(tiny_model):
    # (The flow-matching ones run on the SD3 and FLUX models: tests/worker/test_families.py.)
    for name, scheduler in SCHEDULERS.items():
        built = job_scheduler(tiny_model, name)
        expected = scheduler.class_name or type(tiny_model.scheduler).__name__
        assert type(built).__name__ == expected, name
        assert built is not tiny_model.scheduler
    # A model offers every one that fits its family by default.
    assert (
        SPEC.schedulers
        == schedulers_for("sd")
        == tuple(name for name, s in SCHEDULERS.items() if "sd" in s.families)
    )


@pytest.mark.parametrize("name", schedulers_for("sd"))
def test_each_scheduler_generates_on_the_tiny_model(tiny_model, name):
    assert model_limit_errors(SPEC, {"scheduler": name}) == {}
    steps = 2  # fewer than PNDM's Runge-Kutta warm-up needs: catches a config that forgets it
    steps_seen = []

    def on_step(step, total):
        steps_seen.append((step, total))
        return True

    output = generate_one(tiny_model, job_request(scheduler=name, steps=steps), on_step=on_step)
    images = output.images
    assert len(images) == 1 and images[0].size == (64, 64)
    assert np.isfinite(np.asarray(images[0], dtype=np.float32)).all()
    # Every step ran and reported, with the scheduler asked for; the shared pipeline has
    # its own scheduler back.
    assert [s for s, _ in steps_seen] == list(range(1, len(steps_seen) + 1))
    assert len(steps_seen) >= steps
    expected = SCHEDULERS[name].class_name or "DDIMScheduler"
    assert type(output.scheduler).__name__ == expected
    assert tiny_model.pipeline.scheduler is tiny_model.scheduler


def _edges(spec):
    """(what the request sets, the same one step past the edge) for every limit edge."""
    low, step = spec.min_size, spec.size_multiple
    square = int((spec.max_pixels**0.5) // step * step)
    return {
        "narrowest, tallest": (
            {"width": low, "height": spec.max_height},
            {"width": low - step, "height": spec.max_height},
        ),
        "widest, lowest": (
            {"width": spec.max_width, "height": low},
            {"width": spec.max_width + step, "height": low},
        ),
        "largest square": (
            {"width": min(square, spec.max_width), "height": min(square, spec.max_height)},
            {"width": min(square, spec.max_width) + step, "height": spec.max_height},
        ),
        "one step": ({"steps": 1}, {"steps": 0}),
        "most steps": ({"steps": spec.max_steps}, {"steps": spec.max_steps + 1}),
        "no guidance": ({"guidance_scale": 0.0, "steps": 1}, {"guidance_scale": -0.1}),
        "most guidance": (
            {"guidance_scale": spec.max_guidance, "steps": 1},
            {"guidance_scale": spec.max_guidance + 0.1},
        ),
        "most images, last seeds": (
            {"num_images": spec.max_num_images, "seed": MAX_SEED, "steps": 1},
            {"num_images": spec.max_num_images + 1},
        ),
        "seed 0": ({"seed": 0, "steps": 1}, None),
        "longest prompts": (
            {"prompt": "a red cube " * (spec.max_prompt_chars // 11), "steps": 1},
            {"prompt": "x" * (spec.max_prompt_chars + 1)},
        ),
        "size off the multiple": ({"steps": 1}, {"width": low + step // 2}),
    }


@pytest.mark.parametrize("edge", list(_edges(SPEC)))
def test_every_limit_edge_the_api_accepts_runs_and_one_past_it_is_refused(tiny_model, edge):
    accepted, refused = _edges(SPEC)[edge]
    request = {"prompt": "a red cube", "output_format": "png", "priority": "normal", **accepted}
    if "prompt" in accepted:
        request["negative_prompt"] = accepted["prompt"][::-1]
    assert model_limit_errors(SPEC, request) == {}
    if refused is not None:
        assert model_limit_errors(SPEC, {**request, **refused}), refused
    job = KINDS["txt2img"].normalize(SPEC, request)
    images = generate_one(tiny_model, job).images
    assert len(images) == job.num_images
    assert {image.size for image in images} == {(job.width, job.height)}
    assert all(np.isfinite(np.asarray(image, dtype=np.float32)).all() for image in images)


def test_every_output_format_the_api_accepts_encodes(tiny_model):
    [image] = generate_one(tiny_model, job_request(steps=1)).images
    for output_format in OUTPUT_FORMATS:
        encoded = encode_image(image, output_format)
        assert encoded.data and (encoded.width, encoded.height) == image.size, output_format


def test_a_pixel_budget_edge_is_exact():
    budget = replace(SPEC, max_pixels_per_job=2 * 128 * 128)
    assert model_limit_errors(budget, {"width": 128, "height": 128, "num_images": 2}) == {}
    assert model_limit_errors(budget, {"width": 128, "height": 136, "num_images": 2})


def test_every_size_tier_of_a_tiered_model_runs_and_another_size_is_refused(tiny_model):
    tiered = replace(SPEC, sizes=("64x64", "128x64", "64x128"), sizes_required=True)
    tiered.check()
    for width, height in tiered.size_tiers:
        request = {"prompt": "a red cube", "output_format": "png", "priority": "normal"}
        request.update(width=width, height=height, steps=1)
        assert model_limit_errors(tiered, request) == {}
        job = KINDS["txt2img"].normalize(tiered, request)
        [image] = generate_one(tiny_model, job).images
        assert image.size == (width, height)
    assert model_limit_errors(tiered, {"width": 128, "height": 128})


def test_a_schedulers_own_step_limit_is_the_apis(tiny_model):
    """LCM samples its steps from 50 and every scheduler was trained over 1,000
    timesteps (DDIM fails at 1,000): the most steps each accepts run, one more is a 422
    naming `steps`, and no model may offer 1,000."""
    from app.catalog import CatalogError
    from app.rules import MAX_STEPS

    deep = replace(SPEC, max_steps=MAX_STEPS)
    deep.check()
    with pytest.raises(CatalogError, match="max_steps"):
        replace(SPEC, max_steps=MAX_STEPS + 1).check()
    for scheduler, most in (("lcm", SCHEDULERS["lcm"].max_steps), ("ddim", MAX_STEPS)):
        request = {"prompt": "p", "scheduler": scheduler, "steps": most, "seed": 1}
        assert model_limit_errors(deep, request) == {}, scheduler
        assert "steps" in model_limit_errors(deep, {**request, "steps": most + 1}), scheduler
        [image] = generate_one(tiny_model, job_request(scheduler=scheduler, steps=most)).images
        assert np.isfinite(np.asarray(image, dtype=np.float32)).all()
