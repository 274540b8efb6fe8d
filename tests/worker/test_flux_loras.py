"""LoRA adapters on a FLUX model (CPU), through the worker's one call: the tiny FLUX
pipeline saved and loaded by the worker's own loader, its adapters
(`diffq model build-tiny-lora --family flux`: every attention projection of the
transformer) checked as the upload checks them and made active by the worker's pipeline
cache. An adapter changes the image and repeats byte for byte; a job without adapters
after jobs with them is the image a fresh worker makes; two adapters apply together."""

from __future__ import annotations

import io

import pytest

from app.addons.lora import Lora
from app.addons.lora.checks import FAMILIES, check
from app.catalog import _spec_from_table
from app.kinds import KINDS
from workers.call import generate


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    from workers.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("flux-loras")
    path = build_tiny_model(root / "flux", family="flux")
    table = {"path": str(path), "family": "flux", "lora_family": "tiny-flux", "dtype": "float32"}
    table.update(default_width=64, default_height=64, max_width=128, max_height=128)
    return _spec_from_table("tiny-flux", {**table, "max_pixels": 16384}, root)


@pytest.fixture(scope="module")
def adapters():
    """Two tiny FLUX LoRAs, each checked as POST /v1/adapters checks it, by digest."""
    from safetensors.torch import load

    from workers.tiny import build_tiny_lora

    found = {}
    for seed in (1, 2):
        data = build_tiny_lora(seed, family="tiny-flux", strength=0.5)
        checked = check(data, FAMILIES["tiny-flux"], field="file", max_bytes=len(data))
        assert checked.family == "tiny-flux" and checked.pairs >= 6
        found[checked.sha256] = load(data)
    return found


def _image(model, spec, loras=(), tensors=None) -> bytes:
    data = {"prompt": "a red fox", "seed": 3, "steps": 2, "loras": loras}
    job = KINDS["txt2img"].normalize(spec, data)
    chosen = {lora.sha256: tensors[lora.sha256] for lora in job.loras}
    [out] = generate(model, [job], on_step=[lambda *_: True], addons={"loras": chosen})
    buffer = io.BytesIO()
    out.images[0].save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_flux_lora_changes_the_image_repeats_and_leaves_no_trace(flux, adapters):
    from workers.pipelines import load_model

    one, two = (Lora(sha, 1.0) for sha in adapters)
    fresh = _image(load_model(flux, "cpu"), flux)
    model = load_model(flux, "cpu")
    with_one = _image(model, flux, [one], adapters)
    assert with_one != fresh
    assert _image(model, flux, [one], adapters) == with_one  # the same bytes again
    both = _image(model, flux, [one, two], adapters)
    assert both not in (with_one, fresh)
    half = _image(model, flux, [Lora(one.sha256, 0.5)], adapters)
    assert half not in (with_one, fresh)
    assert _image(model, flux, [], adapters) == fresh  # disabled: the base layers alone
    assert set(model.adapters.loaded) == set(adapters)


def test_a_flux_lora_is_refused_for_an_sd_model_and_an_sd_one_for_flux():
    from app.addons.lora.checks import AdapterRefused
    from workers.tiny import build_tiny_lora

    flux_lora = build_tiny_lora(1, family="tiny-flux")
    with pytest.raises(AdapterRefused, match="made for a transformer"):
        check(flux_lora, FAMILIES["tiny"], field="file", max_bytes=len(flux_lora))
    sd_lora = build_tiny_lora(1)
    with pytest.raises(AdapterRefused, match="made for a unet"):
        check(sd_lora, FAMILIES["tiny-flux"], field="file", max_bytes=len(sd_lora))
    # A tiny FLUX LoRA is another width than FLUX.1's transformer (32 against 3072).
    with pytest.raises(AdapterRefused, match="attention takes 3072"):
        check(flux_lora, FAMILIES["flux"], field="file", max_bytes=len(flux_lora))


def test_kohyas_flux_form_is_refused_naming_the_form():
    import json
    import struct

    from app.addons.lora.checks import AdapterRefused

    tensors = {
        "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": [4, 3072],
        "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight": [9216, 4],
    }
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 2 * shape[0] * shape[1]
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    data = struct.pack("<Q", len(raw)) + raw + bytes(offset)
    with pytest.raises(AdapterRefused, match="kohya's FLUX form"):
        check(data, FAMILIES["flux"], field="file", max_bytes=len(data))
