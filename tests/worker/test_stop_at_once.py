"""A cancel or a hand-back seen at step k leaves the pipeline at once: no further steps,
no VAE decode, no safety checker (counted by wrapping them)."""

from __future__ import annotations

import pytest

from testbed.factories import generate_one, job_request
from workers.call import Interrupted


@pytest.fixture
def counted(tiny_pipeline, monkeypatch):
    calls = {"decode": 0, "safety": 0}
    decode = tiny_pipeline.vae.decode

    def counting_decode(*args, **kwargs):
        calls["decode"] += 1
        return decode(*args, **kwargs)

    def counting_safety(image, device, dtype):
        calls["safety"] += 1
        return image, None

    monkeypatch.setattr(tiny_pipeline.vae, "decode", counting_decode)
    monkeypatch.setattr(tiny_pipeline, "run_safety_checker", counting_safety)
    return calls


def test_a_full_run_decodes_once_and_checks_once(tiny_model, counted):
    steps = []
    images = generate_one(
        tiny_model, job_request(steps=4), on_step=lambda s, t: steps.append(s) or 1
    ).images
    assert len(images) == 1 and steps == [1, 2, 3, 4]
    assert counted == {"decode": 1, "safety": 1}  # the counters see what they should


@pytest.mark.parametrize("stop_at", [1, 3])
def test_a_stop_leaves_without_more_steps_decode_or_safety_check(tiny_model, counted, stop_at):
    steps = []

    def on_step(step, _total):
        steps.append(step)
        return step < stop_at

    with pytest.raises(Interrupted):
        generate_one(tiny_model, job_request(steps=12), on_step=on_step)
    print(f"stopped at step {stop_at} of 12: steps run {steps}, calls {counted}")
    assert steps == list(range(1, stop_at + 1))
    assert counted == {"decode": 0, "safety": 0}
