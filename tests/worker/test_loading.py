"""Loading like people do it: fp16 variant files, a separate VAE, bf16 refused where the
GPU lacks it, the safety checker off unless asked, its blacked images flagged."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from app.catalog import tiny_spec
from testbed.factories import generate_one, job_request
from workers.pipelines import ModelLoadError, load_model, load_options, resolve_dtype
from workers.tiny import build_tiny_pipeline


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_pipeline):
    """The tiny model saved as fp16-variant files only, and a different VAE beside it."""
    root = tmp_path_factory.mktemp("loading")
    tiny_pipeline.save_pretrained(root / "variant", variant="fp16")
    other_vae = build_tiny_pipeline(seed=1).vae
    other_vae.save_pretrained(root / "vae-fix")
    return root, other_vae


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    return all(torch.equal(x, y) for x, y in pairs)


def test_variant_files_load_only_when_the_model_names_the_variant(saved, tiny_pipeline):
    root, _ = saved
    assert list((root / "variant" / "unet").glob("*.fp16.safetensors"))
    spec = replace(tiny_spec(root / "variant"), variant="fp16")
    model = load_model(spec, "cpu")
    assert _same(model.pipeline.unet, tiny_pipeline.unet)
    with pytest.raises(ModelLoadError):
        load_model(replace(spec, variant=None), "cpu")  # no plain files to find


def test_a_separate_vae_replaces_the_models_own(saved, tiny_pipeline):
    root, other_vae = saved
    spec = replace(tiny_spec(root / "variant"), variant="fp16", vae_path=root / "vae-fix")
    model = load_model(spec, "cpu")
    assert _same(model.pipeline.vae, other_vae)
    assert not _same(model.pipeline.vae, tiny_pipeline.vae)
    with pytest.raises(ModelLoadError, match=r"vae_path .* has no config\.json"):
        load_model(replace(spec, vae_path=root / "nowhere"), "cpu")


def test_bf16_is_refused_where_the_gpu_lacks_it(monkeypatch, tmp_path):
    spec = replace(tiny_spec(tmp_path), dtype="bfloat16")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *_, **__: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Tesla T4")
    with pytest.raises(ModelLoadError, match=r"bfloat16 .* Tesla T4 lacks it: use dtype"):
        resolve_dtype(spec, "cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *_, **__: True)
    assert resolve_dtype(spec, "cuda") == torch.bfloat16
    assert resolve_dtype(spec, "cpu") == torch.float32  # the CPU computes in float32


def test_the_safety_checker_is_off_unless_the_model_asks(saved):
    root, _ = saved
    spec = tiny_spec(root / "variant")
    assert load_options(spec, torch.float32)["safety_checker"] is None
    assert "safety_checker" not in load_options(replace(spec, safety_checker=True), torch.float32)


def test_blacked_images_are_flagged(tiny_model, monkeypatch):
    def checker(image, device, dtype):
        flags = [i % 2 == 0 for i in range(image.shape[0])]  # the 1st and 3rd image
        return image * 0, flags

    monkeypatch.setattr(tiny_model.pipeline, "run_safety_checker", checker)
    output = generate_one(tiny_model, job_request(steps=1, num_images=3))
    assert output.nsfw == [True, False, True] and len(output.images) == 3


def test_the_models_digest_changes_with_everything_that_shapes_its_images(saved, tmp_path):
    """The result cache keys on the loaded model's digest: a separate VAE, the safety
    checker, an edited scheduler configuration, the dtype and the variant each give
    another digest, so another cache key (a miss), and the same model the same one."""
    import json
    import shutil

    from app.jobs.cache import cache_key
    from workers.manifest import model_digest

    root, _ = saved
    spec = replace(tiny_spec(root / "variant"), variant="fp16")
    base = load_model(spec, "cpu")
    assert load_model(spec, "cpu").digest == base.digest
    edited = tmp_path / "edited"
    shutil.copytree(root / "variant", edited)
    config = edited / "scheduler" / "scheduler_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "beta_end": 0.02}))
    digests = {
        "as saved": base.digest,
        "vae_path": load_model(replace(spec, vae_path=root / "vae-fix"), "cpu").digest,
        "safety_checker": load_model(replace(spec, safety_checker=True), "cpu").digest,
        "scheduler configuration": load_model(replace(spec, path=edited), "cpu").digest,
    }
    # The CPU computes in float32 whatever is asked, and a variant picks other files: what
    # they change is the digest's input, shown here directly.
    made_of = {"vae_sha": None, "dtype": "float32", "variant": "fp16", "safety_checker": False}
    weights = base.manifest["weights_sha256"]
    assert model_digest(weights, **made_of) == base.digest
    digests["dtype"] = model_digest(weights, **{**made_of, "dtype": "float16"})
    digests["variant"] = model_digest(weights, **{**made_of, "variant": None})
    print({name: digest[:12] for name, digest in digests.items()})
    assert len(set(digests.values())) == len(digests)
    request = job_request(seed=1)
    assert len({cache_key(d, request) for d in digests.values()}) == len(digests)
    manifest = load_model(replace(spec, vae_path=root / "vae-fix"), "cpu").manifest
    assert manifest["vae_sha256"] and manifest["variant"] == "fp16"
    assert manifest["model_sha256"] == digests["vae_path"]
