"""Every scheduler the catalog accepts runs: a bad name is a 422, never a dead letter."""

from __future__ import annotations

import numpy as np
import pytest

from app.catalog import SCHEDULERS
from tests.worker.conftest import job_params
from workers.generation import SCHEDULER_CLASSES, generate_images


def test_every_catalog_scheduler_has_a_worker_class():
    assert set(SCHEDULERS) - {"default"} == set(SCHEDULER_CLASSES)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_each_scheduler_generates_on_the_tiny_model(tiny_pipeline, name):
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
