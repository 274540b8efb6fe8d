"""A model's bytes on its device (workers/footprint.py): estimated from its safetensors
headers before it loads, in the dtype it loads in, and measured once loaded; the worker's
model cache makes room from the estimate."""

from __future__ import annotations

from dataclasses import replace

from app.catalog import tiny_spec
from workers.footprint import estimate_bytes, measured_bytes


def test_the_estimate_from_the_files_is_the_loaded_size_in_each_dtype(tiny_pipeline, tmp_path):
    folder = tmp_path / "tiny"
    tiny_pipeline.save_pretrained(folder)
    spec = tiny_spec(folder)
    measured = measured_bytes(tiny_pipeline)
    full = estimate_bytes(spec, element_size=4)
    half = estimate_bytes(spec, element_size=2)
    print(f"measured {measured} bytes, estimated {full} (float32), {half} (float16)")
    assert measured > 0
    assert abs(full - measured) <= measured * 0.01  # float32 as loaded here
    assert abs(half - measured / 2) <= measured * 0.01  # the same weights in half precision


def test_a_variant_counts_its_own_files_and_an_unreadable_folder_counts_nothing(
    tiny_pipeline, tmp_path
):
    import torch
    from safetensors.torch import load_file, save_file

    half = tmp_path / "half"
    tiny_pipeline.save_pretrained(half)
    for path in list(half.glob("*/*.safetensors")):  # the fp16 variant beside the weights
        tensors = {k: v.to(torch.float16) for k, v in load_file(path).items()}
        save_file(tensors, path.with_name(path.name.replace(".safetensors", ".fp16.safetensors")))
    measured = measured_bytes(tiny_pipeline)
    spec = replace(tiny_spec(half), variant="fp16")
    # Loaded in float32 from fp16 files: counted at the dtype it loads in, not the files'.
    assert abs(estimate_bytes(spec, element_size=4) - measured) <= measured * 0.01
    for path in list(half.glob("*/*.fp16.safetensors")):  # only the variant's files count
        save_file({"w": torch.zeros(8, dtype=torch.float16)}, path)
    assert estimate_bytes(spec, element_size=4) == 4 * 8 * len(list(half.glob("*/*.fp16.*")))
    assert estimate_bytes(tiny_spec(tmp_path / "missing"), element_size=4) == 0
