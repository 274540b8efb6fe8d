"""Build a tiny random-weight Stable Diffusion pipeline with an offline tokenizer."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path


def _bytes_to_unicode() -> list[str]:
    """CLIP's byte-level alphabet: 256 printable stand-ins for the 256 byte values."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            codes.append(256 + extra)
            extra += 1
    return [chr(c) for c in codes]


def _tokenizer_files(folder: Path) -> tuple[Path, Path, dict[str, int]]:
    """A byte-level BPE vocabulary with no merges: every byte is a token."""
    alphabet = _bytes_to_unicode()
    vocab: dict[str, int] = {}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    for ch in alphabet:
        vocab[f"{ch}</w>"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    vocab_file = folder / "vocab.json"
    merges_file = folder / "merges.txt"
    vocab_file.write_text(json.dumps(vocab))
    merges_file.write_text("#version: 0.2\n")
    return vocab_file, merges_file, vocab


def build_tiny_pipeline(seed: int = 0):
    """The pipeline object, weights drawn from `seed` (same seed, same weights)."""
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file, merges_file, vocab = _tokenizer_files(Path(tmp))
        tokenizer = CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=77)
    eos = vocab["<|endoftext|>"]
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=vocab["<|startoftext|>"],
            eos_token_id=eos,
            pad_token_id=eos,
            hidden_size=32,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            vocab_size=len(vocab),
            max_position_embeddings=77,
            projection_dim=32,
        )
    )
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
    )
    # Four blocks, so three downsamplings: latents are 1/8 of the image per side, as in
    # every Stable Diffusion VAE. The UNet then works on (pixels / 64) positions, and its
    # cost and the VAE's grow with the pixels rather than with their square.
    vae = AutoencoderKL(
        block_out_channels=[16, 32, 64, 64],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=64,
    )
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    return StableDiffusionPipeline(
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def build_tiny_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Save the tiny pipeline with save_pretrained; it loads back with from_pretrained."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so a reader never sees half a model.
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        staging = Path(tmp) / "model"
        build_tiny_pipeline(seed).save_pretrained(staging)
        for path in [staging, *staging.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        if out.exists():
            raise FileExistsError(f"{out} already exists")
        staging.rename(out)
    return out
