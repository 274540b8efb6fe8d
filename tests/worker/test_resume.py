"""A run resumed from a checkpoint gives the uninterrupted run's bytes: for every
scheduler each family offers (ancestral and multistep ones, Heun's half steps, LCM's
noise), for image kinds (text to image, image to image, inpainting) and video kinds
(Wan, its image-to-video model, LTX-Video's two kinds), on the tiny models. The state goes
through its stored bytes (`dumps`/`loads`, read back with `weights_only`) each time.
A checkpoint saved as a job leaves (a hand-back) resumes the same way; one that does not
fit the call (another size, another step count) is refused and the job runs afresh."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.catalog import _spec_from_table
from app.kinds import KINDS, get_kind
from app.kinds.images import InputRef
from app.rules import schedulers_for
from workers import denoise_state
from workers.call import Interrupted, generate
from workers.pipelines import load_model
from workers.tiny import build_tiny_model


class Checkpoints:
    """What a worker's JobCheckpoints does for the call, kept in memory."""

    def __init__(self, *, at: int | None = None, resume=None) -> None:
        self.at = at
        self.resume = resume
        self.saved: list[tuple[denoise_state.DenoiseState, bool]] = []
        self.refusals: list[str] = []
        self.resumed_at: list[int] = []

    def due(self, step: int, total: int) -> bool:
        return step == self.at

    def save(self, state, *, leaving: bool) -> None:
        stored = denoise_state.loads(denoise_state.dumps(state))  # through its bytes
        self.saved.append((stored, leaving))

    def refused(self, reason: str) -> None:
        self.refusals.append(reason)
        self.resume = None

    def resumed(self, step: int) -> None:
        self.resumed_at.append(step)


def _pixels(output) -> bytes:
    return b"".join(np.asarray(image).tobytes() for image in output.images)


def _picture(size=(64, 64)) -> Image.Image:
    rng = np.random.default_rng(4)
    return Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))


def _spec(name: str, path: Path, family: str, **table):
    values = {
        "path": str(path),
        "family": family,
        "dtype": "float32",
        "default_width": 64,
        "default_height": 64,
        "max_width": 128,
        "max_height": 128,
        "max_pixels": 16384,
        "default_steps": 4,
        **table,
    }
    return _spec_from_table(name, values, path.parent)


FAMILIES = {
    # name: (family, build keywords, catalog table)
    "sd3": ("sd3", {}, {}),
    "flux": ("flux", {}, {}),
    "wan": ("wan", {}, {"default_frames": 9, "max_frames": 17}),
    "wan-i2v": ("wan", {"image_to_video": True}, {"kinds": ["img2vid"], "default_frames": 9}),
    "ltx": ("ltx", {}, {"min_size": 32, "default_frames": 9, "max_frames": 17}),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_model):
    import torch

    root = tmp_path_factory.mktemp("resume")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    loaded = {"sd": tiny_model}
    for name, (family, build, table) in FAMILIES.items():
        path = build_tiny_model(root / name, family=family, **build)
        loaded[name] = load_model(_spec(name, path, family, **table), "cpu")
    yield loaded
    torch.set_num_threads(threads)


def _job(model, kind: str, scheduler: str, steps: int = 4):
    data = {"prompt": "a lighthouse", "seed": 11, "steps": steps, "scheduler": scheduler}
    inputs: dict = {}
    if kind in ("img2img", "inpaint", "img2vid"):
        image = _picture()
        data["image"] = InputRef("a" * 64, 64, 64, "RGB")
        inputs["image"] = image
    if kind == "img2img":
        data["strength"] = 0.75
        data["steps"] = 8  # six steps at that strength
    if kind == "inpaint":
        mask = Image.new("L", (64, 64), 0)
        mask.paste(255, (16, 16, 48, 48))
        data["mask"] = InputRef("b" * 64, 64, 64, "L")
        inputs["mask"] = mask
    if kind in ("txt2vid", "img2vid"):
        data.update(num_frames=9, width=64, height=64)
    return get_kind(kind).normalize(model.spec, data), inputs


def _cases():
    for scheduler in schedulers_for("sd"):
        yield "sd", "txt2img", scheduler
    for kind in ("img2img", "inpaint"):
        yield "sd", kind, "euler_a"  # ancestral: noise drawn every step
        yield "sd", kind, "dpm++"  # multistep: earlier outputs carried
    for name in ("sd3", "flux"):
        for scheduler in schedulers_for(name):
            yield name, "txt2img", scheduler
    for name, (family, _build, table) in FAMILIES.items():
        if family in ("wan", "ltx"):
            both = ["txt2vid", "img2vid"] if family == "ltx" else ["txt2vid"]
            kinds = table.get("kinds") or both
            for kind in kinds:
                for scheduler in schedulers_for(family):
                    yield name, kind, scheduler


def _run(model, job, inputs, checkpoints=None, on_step=None):
    [output] = generate(
        model,
        [job],
        on_step=[on_step or (lambda *_: True)],
        inputs=[inputs],
        checkpoints=checkpoints,
    )
    return output


@pytest.mark.parametrize(("name", "kind", "scheduler"), list(_cases()))
def test_a_resumed_run_gives_the_uninterrupted_runs_bytes(models, name, kind, scheduler):
    model = models[name]
    job, inputs = _job(model, kind, scheduler)
    plain = _run(model, job, inputs)
    seen: list[int] = []
    total = []

    def count(step, steps):
        seen.append(step)
        total.append(steps)
        return True

    probe = _run(model, job, inputs, on_step=count)
    steps = total[-1]
    at = steps // 2 + (steps % 2)  # past the middle (Heun's: between its two half steps)
    saving = Checkpoints(at=at)
    first = _run(model, job, inputs, saving)
    assert _pixels(first) == _pixels(plain) == _pixels(probe)  # saving changes nothing
    [(state, leaving)] = saving.saved
    assert (state.step, state.total, leaving) == (at, steps, False)

    resuming = Checkpoints(resume=state)
    resumed = _run(model, job, inputs, resuming)
    print(f"{name} {kind} {scheduler}: resumed at {at} of {steps} steps")
    assert resuming.resumed_at == [at] and resumed.resumed_from == at
    assert resuming.refusals == []
    assert _pixels(resumed) == _pixels(plain)
    assert model.pipeline.scheduler is model.scheduler  # the call's own went back
    assert type(getattr(model.pipeline, "unet", None) or model.pipeline.transformer).__name__ != (
        "SkippedDenoiser"
    )


@pytest.mark.parametrize("name", ["sd", "ltx"])
def test_a_job_handed_back_saves_where_it_left_and_resumes_there(models, name):
    model = models[name]
    kind = model.spec.kinds[0]
    job, inputs = _job(model, kind, "default", steps=6)
    plain = _run(model, job, inputs)
    leaving = Checkpoints()  # no periodic save: only the one as it leaves

    with pytest.raises(Interrupted):
        _run(model, job, inputs, leaving, on_step=lambda step, _total: step < 4)
    [(state, left)] = leaving.saved
    assert (state.step, left) == (4, True)
    resumed = _run(model, job, inputs, Checkpoints(resume=state))
    assert resumed.resumed_from == 4
    assert _pixels(resumed) == _pixels(plain)


def test_a_state_that_does_not_fit_the_call_is_refused_and_the_job_runs_afresh(models):
    model = models["sd"]
    job, inputs = _job(model, "txt2img", "euler")
    saving = Checkpoints(at=2)
    _run(model, job, inputs, saving)
    [(state, _)] = saving.saved

    bigger = replace(job, width=128, height=128)
    refusing = Checkpoints(resume=state)
    output = _run(model, bigger, inputs, refusing)
    assert output.resumed_from is None and refusing.resumed_at == []
    assert len(refusing.refusals) == 1 and "do not fit" in refusing.refusals[0]
    assert _pixels(output) == _pixels(_run(model, bigger, inputs))

    longer = replace(job, steps=6)
    refusing = Checkpoints(resume=state)
    output = _run(model, longer, inputs, refusing)
    assert refusing.refusals == ["it was made for 4 steps, not 6"]
    assert _pixels(output) == _pixels(_run(model, longer, inputs))

    late = Checkpoints(at=3)
    _run(model, job, inputs, late)
    [(at_three, _)] = late.saved
    shorter = replace(job, steps=2)  # its loop ends before the state's step
    refusing = Checkpoints(resume=at_three)
    output = _run(model, shorter, inputs, refusing)
    assert refusing.refusals == ["the call ended before step 3"]
    assert _pixels(output) == _pixels(_run(model, shorter, inputs))


def test_unreadable_bytes_are_a_state_error_never_code(tmp_path):
    import pickle

    class Boom:
        def __reduce__(self):
            return (Path(tmp_path / "ran").write_text, ("x",))

    with pytest.raises(denoise_state.StateError):
        denoise_state.loads(pickle.dumps({"format": 1, "x": Boom()}, protocol=2))
    assert not (tmp_path / "ran").exists()
    blob = denoise_state.dumps(
        denoise_state.DenoiseState(1, 2, __import__("torch").zeros(2), {}, [], {"job": "j"})
    )
    with pytest.raises(denoise_state.StateError, match="unreadable"):
        denoise_state.loads(blob[: len(blob) // 2])  # a write that stopped half way
    assert denoise_state.loads(blob).meta == {"job": "j"}


def test_restore_puts_back_the_rng_states_and_every_scheduler_attribute():
    """The skipped steps draw the same noise as the real ones did, so the resume tests
    above would pass without the RNG's restore: it is held here on its own."""
    import torch
    from diffusers import DPMSolverMultistepScheduler

    scheduler = DPMSolverMultistepScheduler()
    scheduler.set_timesteps(6)
    generators = [torch.Generator().manual_seed(s) for s in (1, 2)]
    latents = torch.randn(2, 4, 8, 8, generator=generators[0])
    for step, t in enumerate(scheduler.timesteps[:3]):
        latents = scheduler.step(torch.full_like(latents, 0.1 * step), t, latents).prev_sample
    saved = denoise_state.capture(3, 6, latents, scheduler, generators)
    state = denoise_state.loads(denoise_state.dumps(saved))
    expected = [g.get_state() for g in generators]

    other = DPMSolverMultistepScheduler()
    other.set_timesteps(6)
    other.stray = "left by a skipped step"
    drawn = [torch.Generator().manual_seed(9) for _ in generators]
    for g in drawn:
        torch.randn(5, generator=g)
    back = denoise_state.restore(state, torch.zeros_like(latents), other, drawn)
    assert torch.equal(back, latents)
    rngs = [torch.equal(g.get_state(), e) for g, e in zip(drawn, expected, strict=True)]
    assert rngs == [True, True]
    assert not hasattr(other, "stray") and other.step_index == scheduler.step_index == 3
    pairs = zip(other.model_outputs, scheduler.model_outputs, strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert other.config == scheduler.config
    with pytest.raises(denoise_state.StateError, match="do not fit"):
        denoise_state.restore(state, torch.zeros(1, 4, 8, 8), other, drawn)


def test_kinds_used_here_cover_every_kind():
    covered = {kind for _name, kind, _scheduler in _cases()}
    assert covered == set(KINDS)
