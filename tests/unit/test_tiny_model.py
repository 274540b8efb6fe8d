"""The tiny model has a real Stable Diffusion VAE's shape: latents are 1/8 of a side."""

from __future__ import annotations

import pytest

from app.catalog import tiny_spec


@pytest.fixture(scope="module")
def pipeline():
    from workers.tiny import build_tiny_pipeline

    return build_tiny_pipeline()


def test_the_vae_downsamples_by_eight_like_every_sd_vae(pipeline):
    import torch

    assert pipeline.vae_scale_factor == 8
    with torch.inference_mode():
        image = pipeline.vae.decode(torch.zeros(1, 4, 8, 9)).sample
        latent = pipeline.vae.encode(torch.zeros(1, 3, 64, 72)).latent_dist.mean
    assert tuple(image.shape) == (1, 3, 64, 72)
    assert tuple(latent.shape) == (1, 4, 8, 9)


def test_the_largest_embedded_size_gives_the_unet_a_small_latent(pipeline, tmp_path):
    spec = tiny_spec(tmp_path)
    side = spec.max_width // pipeline.vae_scale_factor
    # 64 x 64 = 4096 positions at 512 x 512, as Stable Diffusion 1.5 has at that size.
    assert side * (spec.max_height // pipeline.vae_scale_factor) <= 64 * 64
    weights = sum(p.numel() for p in pipeline.vae.parameters())
    weights += sum(p.numel() for p in pipeline.unet.parameters())
    print(f"tiny VAE + UNet parameters: {weights}")
    assert weights < 3_000_000
