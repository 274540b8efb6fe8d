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
from app.rules import MAX_SEED, OUTPUT_FORMATS, SCHEDULERS, model_limit_errors, normalize
from testbed.factories import job_params
from workers.encoding import encode_image
from workers.generation import generate_images, job_scheduler

SPEC = tiny_spec(Path("/models/tiny"))


def test_every_scheduler_in_the_table_is_a_class_the_worker_builds(tiny_pipeline):
    for name, scheduler in SCHEDULERS.items():
        built = job_scheduler(tiny_pipeline, name)
        expected = scheduler.class_name or type(tiny_pipeline.scheduler).__name__
        assert type(built).__name__ == expected, name
        assert built is not tiny_pipeline.scheduler
    assert SPEC.schedulers == tuple(SCHEDULERS)  # a model offers all of them by default


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_each_scheduler_generates_on_the_tiny_model(tiny_pipeline, name):
    assert model_limit_errors(SPEC, {"scheduler": name}) == {}
    steps = 2  # fewer than PNDM's Runge-Kutta warm-up needs: catches a config that forgets it
    steps_seen = []

    def on_step(step, total):
        steps_seen.append((step, total))
        return True

    images = generate_images(
        tiny_pipeline, job_params(scheduler=name, steps=steps), device="cpu", on_step=on_step
    )
    assert len(images) == 1 and images[0].size == (64, 64)
    assert np.isfinite(np.asarray(images[0], dtype=np.float32)).all()
    # Every step ran and reported; the shared pipeline keeps its own scheduler.
    assert [s for s, _ in steps_seen] == list(range(1, len(steps_seen) + 1))
    assert len(steps_seen) >= steps
    assert type(tiny_pipeline.scheduler).__name__ == "DDIMScheduler"


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
def test_every_limit_edge_the_api_accepts_runs_and_one_past_it_is_refused(tiny_pipeline, edge):
    accepted, refused = _edges(SPEC)[edge]
    request = {"prompt": "a red cube", "output_format": "png", "priority": "normal", **accepted}
    if "prompt" in accepted:
        request["negative_prompt"] = accepted["prompt"][::-1]
    assert model_limit_errors(SPEC, request) == {}
    if refused is not None:
        assert model_limit_errors(SPEC, {**request, **refused}), refused
    params = normalize(SPEC, request)
    images = generate_images(tiny_pipeline, params, device="cpu", on_step=lambda *_: True)
    assert len(images) == params["num_images"]
    assert {image.size for image in images} == {(params["width"], params["height"])}
    assert all(np.isfinite(np.asarray(image, dtype=np.float32)).all() for image in images)


def test_every_output_format_the_api_accepts_encodes(tiny_pipeline):
    [image] = generate_images(
        tiny_pipeline, job_params(steps=1), device="cpu", on_step=lambda *_: True
    )
    for output_format in OUTPUT_FORMATS:
        encoded = encode_image(image, output_format)
        assert encoded.data and (encoded.width, encoded.height) == image.size, output_format


def test_a_pixel_budget_edge_is_exact():
    budget = replace(SPEC, max_pixels_per_job=2 * 128 * 128)
    assert model_limit_errors(budget, {"width": 128, "height": 128, "num_images": 2}) == {}
    assert model_limit_errors(budget, {"width": 128, "height": 136, "num_images": 2})


def test_every_size_tier_of_a_tiered_model_runs_and_another_size_is_refused(tiny_pipeline):
    tiered = replace(SPEC, sizes=("64x64", "128x64", "64x128"), sizes_required=True)
    tiered.check()
    for width, height in tiered.size_tiers:
        request = {"prompt": "a red cube", "output_format": "png", "priority": "normal"}
        request.update(width=width, height=height, steps=1)
        assert model_limit_errors(tiered, request) == {}
        params = normalize(tiered, request)
        [image] = generate_images(tiny_pipeline, params, device="cpu", on_step=lambda *_: True)
        assert image.size == (width, height)
    assert model_limit_errors(tiered, {"width": 128, "height": 128})
