"""Adapters checked from their safetensors header alone (app/addons/lora/checks.py), and the
request's `loras`: stored, read back, in the cache key, the batch key and the estimate."""

from __future__ import annotations

import json
import pickle
import struct

import pytest

from app.addons.lora import Lora
from app.addons.lora.checks import FAMILIES, AdapterRefused, check
from app.jobs.cache import cache_key
from app.kinds import request_from_stored
from testbed.factories import job_request
from workers.tiny import build_tiny_lora

TINY, SDXL = FAMILIES["tiny"], FAMILIES["sdxl"]


def _refused(data: bytes, family=TINY, max_bytes=10**8) -> str:
    with pytest.raises(AdapterRefused) as refused:
        check(data, family, field="file", max_bytes=max_bytes)
    assert refused.value.field == "file"
    return refused.value.message


def _safetensors(shapes: dict[str, list[int]]) -> bytes:
    """A file of F32 zeros with these shapes (built by hand: any key, any shape)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * shape[0] * shape[1]
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def test_a_tiny_lora_passes_with_its_rank_and_layers():
    checked = check(build_tiny_lora(0, rank=4), TINY, field="file", max_bytes=10**8)
    assert (checked.rank, checked.family, len(checked.sha256)) == (4, "tiny", 64)
    assert checked.pairs == 24  # to_q, to_k, to_v of 2 attentions in 4 transformer blocks


def test_a_pickle_a_zip_and_text_are_not_safetensors():
    for data in (pickle.dumps({"w": [1, 2, 3]}), b"PK\x03\x04" + bytes(64), b"hello world!"):
        assert "Not a safetensors file" in _refused(data)


def test_a_truncated_file_is_refused_wherever_it_ends():
    data = build_tiny_lora(0)
    assert "Truncated" in _refused(data[:5])
    assert "Truncated" in _refused(data[:40])  # inside the header
    assert "Truncated" in _refused(data[:-10])  # inside the tensors


def test_an_sdxl_lora_for_an_sd15_model_names_the_mismatch():
    message = _refused(build_tiny_lora(0, cross_attention_dim=2048), FAMILIES["sd15"])
    assert "sd15" in message and "2048" in message and "768" in message
    assert "tiny" in _refused(build_tiny_lora(0, cross_attention_dim=64))
    second_encoder = _safetensors(
        {
            "lora_te2_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight": [4, 1280],
            "lora_te2_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight": [1280, 4],
        }
    )
    assert "two text encoders" in _refused(second_encoder, FAMILIES["sd15"])
    check(second_encoder, SDXL, field="file", max_bytes=10**8)  # kohya keys, for SDXL: fine


def test_rank_mismatch_too_high_a_rank_and_foreign_keys_are_refused():
    prefix = "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q"
    mismatch = _safetensors(
        {f"{prefix}.lora_A.weight": [4, 64], f"{prefix}.lora_B.weight": [64, 8]}
    )
    assert "Rank mismatch" in _refused(mismatch)
    huge = _safetensors(
        {f"{prefix}.lora_A.weight": [300, 64], f"{prefix}.lora_B.weight": [64, 300]}
    )
    assert "at most 256" in _refused(huge)
    half = _safetensors({f"{prefix}.lora_A.weight": [4, 64]})
    assert "both its down and up" in _refused(half)
    model = _safetensors({"model.diffusion_model.input_blocks.0.0.weight": [4, 4]})
    assert "Not a LoRA key" in _refused(model)
    assert "at most 100" in _refused(build_tiny_lora(0), max_bytes=100)


def test_loras_are_stored_read_back_and_change_the_cache_and_batch_keys():
    plain = job_request()
    assert "loras" not in plain.stored()  # a job without adapters stores as before
    assert plain.adapter_set == ""
    used = job_request(loras=[{"sha256": "a" * 64, "scale": 0.5}])
    assert used.loras == (Lora("a" * 64, 0.5),)
    assert used.stored()["loras"] == [{"sha256": "a" * 64, "scale": 0.5}]
    again = request_from_stored(json.loads(json.dumps(used.stored())))
    assert again == used and again.adapter_set == used.adapter_set != ""
    other_scale = job_request(loras=[{"sha256": "a" * 64, "scale": 0.6}])
    keys = {cache_key("m", r) for r in (plain, used, other_scale)}
    assert len(keys) == 3
    assert other_scale.adapter_set != used.adapter_set
    assert used.work == pytest.approx(plain.work * 1.1)  # the estimate charges adapters


def test_the_cli_lora_option_takes_an_id_or_a_shared_name_with_a_scale():
    from cli.client import _loras

    some_id = "01937c52-5d0e-7b9a-8e0f-6a2b4c1d9e33"
    assert _loras([f"{some_id}:0.8", "ink", "ink:-0.5"]) == [
        {"id": some_id, "scale": 0.8},
        {"name": "ink"},
        {"name": "ink", "scale": -0.5},
    ]
    with pytest.raises(ValueError, match="must be a number"):
        _loras(["ink:strong"])
