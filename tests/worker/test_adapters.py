"""LoRA adapters on the tiny model (CPU), through the worker's one call: an adapter
changes the image, a job without adapters after jobs with them is byte for byte the
image of a worker that never loaded one (every kind), a hot-swapped slot gives each
adapter its own image back, the memory cache is bounded in bytes, and only jobs of one
adapter set share a call."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.addons.lora import Lora
from app.addons.lora import worker as worker_adapters
from app.addons.lora.worker import AdapterMemory
from app.catalog import tiny_spec
from app.kinds import KINDS, compatible
from app.kinds.images import InputRef
from workers.call import generate
from workers.pipelines import LoadedModel
from workers.tiny import build_tiny_lora, build_tiny_pipeline

SPEC = tiny_spec(Path("/models/tiny"))


@pytest.fixture(scope="module")
def loras():
    """Three adapters' tensors by digest (as the worker's memory cache hands them)."""
    import hashlib

    from safetensors.torch import load

    made = {}
    for seed in (1, 2, 3):
        data = build_tiny_lora(seed)
        made[hashlib.sha256(data).hexdigest()] = load(data)
    return made


def _model(slots: int = 8, max_bytes: int = 0) -> LoadedModel:
    import torch

    torch.set_num_threads(1)
    pipeline = build_tiny_pipeline(seed=0)
    pipeline.set_progress_bar_config(disable=True)
    model = LoadedModel(SPEC, pipeline, "cpu", 0.0)
    model.adapters.capacity = slots
    model.adapters.max_bytes = max_bytes
    return model


def _picture() -> Image.Image:
    rng = np.random.default_rng(5)
    return Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))


def _request(kind: str = "txt2img", used=(), scale: float = 1.0, **fields):
    refs = {}
    if kind != "txt2img":
        refs["image"] = InputRef("a" * 64, 64, 64, "RGB")
    if kind == "inpaint":
        refs["mask"] = InputRef("b" * 64, 64, 64, "L")
    data = {"prompt": "a red fox", "seed": 3, "steps": 2, **refs, **fields}
    data["loras"] = tuple(Lora(sha, scale) for sha in used)
    return KINDS[kind].normalize(SPEC, data)


def _inputs(kind: str) -> dict:
    if kind == "txt2img":
        return {}
    found = {"image": _picture()}
    if kind == "inpaint":
        mask = Image.new("L", (64, 64), 0)
        mask.paste(255, (16, 16, 48, 48))
        found["mask"] = mask
    return found


def _image(model, request, tensors) -> bytes:
    [made] = generate(
        model,
        [request],
        on_step=[lambda *_: True],
        inputs=[_inputs(request.kind)],
        addons={"loras": {lora.sha256: tensors[lora.sha256] for lora in request.loras}},
    )
    return made.images[0].tobytes()


@pytest.mark.parametrize("kind", ["txt2img", "img2img", "inpaint"])
def test_a_job_without_adapters_after_jobs_with_them_is_a_fresh_workers_image(kind, loras):
    one, two, _ = loras
    fresh = _image(_model(), _request(kind), loras)
    used = _model()
    with_one = _image(used, _request(kind, [one]), loras)
    with_both = _image(used, _request(kind, [one, two], scale=0.7), loras)
    after = _image(used, _request(kind), loras)
    assert with_one != fresh and with_both != with_one  # the adapters do change the image
    assert after == fresh  # byte for byte: nothing of them is left in the weights
    assert sorted(used.adapters.loaded) == sorted([one, two])  # still warm for the next


def test_the_scale_changes_the_image_and_a_warm_adapter_gives_the_same_image(loras):
    one = next(iter(loras))
    model = _model()
    full = _image(model, _request(used=[one]), loras)
    half = _image(model, _request(used=[one], scale=0.5), loras)
    again = _image(model, _request(used=[one]), loras)
    assert half != full
    assert again == full
    assert _image(_model(), _request(used=[one]), loras) == full  # cold or warm, one image


def test_a_full_pipeline_swaps_its_least_recent_slot_and_each_adapter_keeps_its_image(
    loras, caplog
):
    import logging

    caplog.set_level(logging.INFO, logger="app.addons.lora.worker")
    one, two, three = loras
    reference = {sha: _image(_model(), _request(used=[sha]), loras) for sha in (one, two, three)}
    model = _model(slots=2)
    for sha in (one, two, three, one, two):
        assert _image(model, _request(used=[sha]), loras) == reference[sha], sha[:8]
    assert len(model.adapters.loaded) == 2
    assert "hot swap did not apply" not in caplog.text  # swapped in place, same rank
    # The cached tensors were never handed to the pipeline itself (a hot swap writes into
    # the loaded ones): a fresh worker from the same cache still makes the same image.
    assert _image(_model(), _request(used=[three]), loras) == reference[three]


def test_the_pipeline_is_bounded_in_bytes_on_its_device(loras, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="app.addons.lora.worker")
    one, two, three = loras
    sizes = {sha: sum(t.numel() * t.element_size() for t in loras[sha].values()) for sha in loras}
    reference = {sha: _image(_model(), _request(used=[sha]), loras) for sha in loras}
    model = _model(slots=8, max_bytes=sizes[one] + sizes[two])  # two of them, not three
    caplog.clear()
    for sha in (one, two, three, one):
        assert _image(model, _request(used=[sha]), loras) == reference[sha], sha[:8]
    assert model.adapters.loaded == [three, one]  # one went for three, then two for one
    assert model.adapters.bytes <= sizes[one] + sizes[two]
    assert caplog.text.count("loaded into the pipeline") == 4
    # A call whose own adapters exceed the bound still runs, with all of them.
    both = _image(model, _request(used=[two, three]), loras)
    assert both == _image(_model(), _request(used=[two, three]), loras)


def test_only_jobs_of_one_adapter_set_share_a_call(loras):
    one, two, _ = loras
    plain, with_one = _request(), _request(used=[one])
    assert compatible(with_one, _request(used=[one], prompt="another"))
    assert not compatible(plain, with_one)
    assert not compatible(with_one, _request(used=[two]))
    assert not compatible(with_one, _request(used=[one], scale=0.5))
    with pytest.raises(ValueError, match="must share"):
        generate(_model(), [plain, with_one], on_step=[lambda *_: True] * 2)


def test_the_memory_cache_is_bounded_in_bytes_and_knows_which_sets_are_warm(monkeypatch):
    import hashlib

    import safetensors.torch

    files = {hashlib.sha256(bytes([i]) * 1000).hexdigest(): bytes([i]) * 1000 for i in range(3)}
    a, b, c = files
    reads = []

    def read(_rt, _tenant, lora):
        reads.append(lora.sha256)
        return files[lora.sha256]

    monkeypatch.setattr(worker_adapters, "_read", read)
    monkeypatch.setattr(safetensors.torch, "load", lambda data: {"weight": data})
    memory = AdapterMemory(max_bytes=2500)
    for sha in files:
        assert memory.tensors(None, None, Lora(sha)) == {"weight": files[sha]}
    assert memory.bytes == 2000 and a not in memory and b in memory and c in memory
    memory.tensors(None, None, Lora(c))
    assert reads == [a, b, c]  # the hit read nothing
    memory.ran([Lora(b), Lora(c)], "set-bc")
    memory.ran([Lora(a)], "set-a")
    assert memory.warm_sets() == ("", "set-bc")  # a was evicted: its set is cold
