"""Build a tiny random-weight Stable Diffusion pipeline with an offline tokenizer (SD3
and FLUX: workers/tiny_flow.py; Wan and LTX-Video: workers/tiny_video.py)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from workers.tiny_tokenizers import _tokenizer_files


def build_tiny_pipeline(seed: int = 0, *, inpainting: bool = False):
    """The pipeline object, weights drawn from `seed` (same seed, same weights). With
    `inpainting`, a dedicated inpainting model: a UNet of 9 input channels (the latents,
    the mask, the masked image's latents) in an inpainting pipeline."""
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionInpaintPipeline,
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
        in_channels=9 if inpainting else 4,
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
    pipeline_class = StableDiffusionInpaintPipeline if inpainting else StableDiffusionPipeline
    return pipeline_class(
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def build_tiny_model(
    out_dir: str | Path,
    seed: int = 0,
    *,
    inpainting: bool = False,
    family: str = "sd",
    image_to_video: bool = False,
) -> Path:
    """Save the tiny pipeline of a family (app/families.py) with save_pretrained; it loads
    back with from_pretrained. `image_to_video` (family "wan" only): Wan 2.1's
    image-to-video model, a pipeline of its own; LTX's one model serves both (its
    image-to-video pipeline is `LTXImageToVideoPipeline.from_pipe`)."""
    if image_to_video and family != "wan":
        raise ValueError(f"no tiny {family!r} model for image to video (only 'wan' has one)")
    if family == "sd":
        pipeline = build_tiny_pipeline(seed, inpainting=inpainting)
    elif family in ("wan", "ltx"):
        from workers.tiny_video import build_tiny_ltx, build_tiny_wan

        if inpainting:
            raise ValueError(f"no tiny {family!r} model for inpainting")
        if family == "wan":
            pipeline = build_tiny_wan(seed, image_to_video=image_to_video)
        else:
            pipeline = build_tiny_ltx(seed)
    else:
        from workers.tiny_flow import BUILDERS

        if inpainting or family not in BUILDERS:
            raise ValueError(f"no tiny {family!r} model{' for inpainting' * inpainting}")
        pipeline = BUILDERS[family](seed)
    return _saved(pipeline, out_dir)


def _saved(made, out_dir: str | Path) -> Path:
    """`made.save_pretrained` to `out_dir`, built beside it and renamed, so that a reader
    never sees half a model."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        staging = Path(tmp) / "model"
        made.save_pretrained(staging)
        for path in [staging, *staging.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        if out.exists():
            raise FileExistsError(f"{out} already exists")
        staging.rename(out)
    return out


def build_tiny_lora(
    seed: int = 0,
    *,
    rank: int = 4,
    cross_attention_dim: int = 32,
    text_encoder: bool = False,
    strength: float = 0.3,
    family: str = "tiny",
) -> bytes:
    """A random LoRA for the tiny model's UNet (every attention projection), as
    safetensors bytes in the diffusers/PEFT form (`unet.<module>.lora_A.weight`).
    `cross_attention_dim` other than 32 makes one for another family (its cross-attention
    projections take that many features); `text_encoder` adds the text encoder's
    attention projections. `family="tiny-flux"`: one for the tiny FLUX model's
    transformer instead (`transformer.<module>`: every attention projection of its
    double and single stream blocks, the context's included)."""
    import torch
    from safetensors.torch import save

    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}

    def pair(prefix: str, in_features: int, out_features: int) -> None:
        down = torch.randn(rank, in_features, generator=generator) * strength
        up = torch.randn(out_features, rank, generator=generator) * strength
        tensors[f"{prefix}.lora_A.weight"] = down.contiguous()
        tensors[f"{prefix}.lora_B.weight"] = up.contiguous()

    if family == "tiny-flux":
        from workers.tiny_flow import build_tiny_flux_pipeline

        projections = ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj")
        transformer = build_tiny_flux_pipeline(0).transformer
        for name, module in transformer.named_modules():
            if isinstance(module, torch.nn.Linear) and name.split(".")[-1] in projections:
                pair(f"transformer.{name}", module.in_features, module.out_features)
        return save(tensors)
    for name, module in build_tiny_pipeline(0).unet.named_modules():
        if isinstance(module, torch.nn.Linear) and name.split(".")[-1] in ("to_q", "to_k", "to_v"):
            in_features = module.in_features
            if ".attn2." in f".{name}" and name.endswith(("to_k", "to_v")):
                in_features = cross_attention_dim
            pair(f"unet.{name}", in_features, module.out_features)
    if text_encoder:
        for layer in range(2):
            for proj in ("q_proj", "k_proj", "v_proj"):
                pair(f"text_encoder.text_model.encoder.layers.{layer}.self_attn.{proj}", 32, 32)
    return save(tensors)


def save_tiny_lora(
    path: str | Path,
    seed: int = 0,
    *,
    rank: int = 4,
    text_encoder: bool = False,
    family: str = "tiny",
    overwrite: bool = False,
):
    """Write `build_tiny_lora`'s adapter to `path` (`diffq model build-tiny-lora`), checked
    first as `POST /v1/adapters` checks it for a model of `family` ("tiny" or
    "tiny-flux"); return the path and that check (`CheckedAdapter`). A reader never sees
    half a file."""
    from app.addons.lora.checks import FAMILIES, check

    data = build_tiny_lora(seed, rank=rank, text_encoder=text_encoder, family=family)
    checked = check(data, FAMILIES[family], field="file", max_bytes=len(data))
    out = Path(path)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        staging.write_bytes(data)
        os.replace(staging, out)
    finally:
        staging.unlink(missing_ok=True)
    return out, checked


def tiny_controlnet(seed: int = 0, *, strength: float = 0.05):
    """A random-weight ControlNet for the tiny model (diffusers' ControlNetModel, shaped
    from its UNet). Every weight is drawn from `seed`, the zero convolutions a trained
    ControlNet starts from included, so a control image changes what the model draws."""
    import torch
    from diffusers import ControlNetModel

    controlnet = ControlNetModel.from_unet(build_tiny_pipeline(0).unet)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in controlnet.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * strength)
    return controlnet


def build_tiny_controlnet(out_dir: str | Path, seed: int = 0, family: str = "sd") -> Path:
    """Save a tiny ControlNet to `out_dir`: `tiny_controlnet(seed)` for the tiny model
    (add-on family `tiny`), or with `family="flux"` workers/tiny_flow.py
    `tiny_flux_controlnet(seed)` for the tiny FLUX model (`tiny-flux`); a reader never
    sees half a directory."""
    if family == "flux":
        from workers.tiny_flow import tiny_flux_controlnet

        return _saved(tiny_flux_controlnet(seed), out_dir)
    if family != "sd":
        raise ValueError(f"no tiny ControlNet for family {family!r} (sd or flux)")
    return _saved(tiny_controlnet(seed), out_dir)
