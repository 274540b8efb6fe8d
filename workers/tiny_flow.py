"""Tiny random-weight SD3 and FLUX pipelines: the published architectures (MMDiT and
FLUX's double and single stream blocks, flow matching, VAEs that downsample by 8, latents
patched 2 x 2) scaled down to a few hundred kilobytes, with offline tokenizers. They load
back with `from_pretrained` like any saved pipeline (workers/tiny.py `build_tiny_model`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from workers.tiny_tokenizers import _tokenizer_files


def _clip_parts(with_projection: bool, count: int):
    """`count` tiny CLIP text encoders and their byte-level tokenizer."""
    import transformers
    from transformers import CLIPTextConfig, CLIPTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        vocab_file, merges_file, vocab = _tokenizer_files(Path(tmp))
        tokenizer = CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=77)
    eos = vocab["<|endoftext|>"]
    config = CLIPTextConfig(
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
        hidden_act="gelu",
    )
    cls = (
        transformers.CLIPTextModelWithProjection if with_projection else transformers.CLIPTextModel
    )
    return [cls(config) for _ in range(count)], tokenizer


def _t5_parts(d_model: int = 32):
    """A tiny T5 encoder and a Unigram tokenizer over letters, digits and punctuation."""
    from transformers import T5Config, T5EncoderModel, T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    for ch in "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-":
        pieces += [(ch, -3.0), (f"▁{ch}", -2.5)]
    tokenizer = T5Tokenizer(vocab=pieces, extra_ids=0)
    encoder = T5EncoderModel(
        T5Config(
            vocab_size=len(pieces),
            d_model=d_model,
            d_kv=8,
            d_ff=37,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
    )
    return encoder, tokenizer


def _vae(latent_channels: int):
    from diffusers import AutoencoderKL

    # Four blocks, three downsamplings: 1/8 of the image per side, as the real VAEs.
    return AutoencoderKL(
        block_out_channels=[16, 32, 64, 64],
        layers_per_block=1,
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        latent_channels=latent_channels,
        norm_num_groups=8,
        sample_size=64,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )


def build_tiny_sd3_pipeline(seed: int = 0):
    """Stable Diffusion 3's layout: two CLIP encoders and a T5, an MMDiT over 2 x 2
    patches, flow-matching Euler with SD3's shift."""
    import torch
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )

    torch.manual_seed(seed)
    (text_encoder, text_encoder_2), tokenizer = _clip_parts(with_projection=True, count=2)
    text_encoder_3, tokenizer_3 = _t5_parts(d_model=64)
    transformer = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=16,  # SD3's 16 latent channels (its inpainting pipeline checks them)
        out_channels=16,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=64,  # the T5's width (the CLIPs' hidden states, padded to it)
        caption_projection_dim=32,
        pooled_projection_dim=64,  # the two CLIPs' pooled projections side by side
        pos_embed_max_size=64,
    )
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=_vae(latent_channels=16),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer,
        text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer_3,
    )


def flux_scheduler(shift: float):
    """FLUX.1's flow-matching Euler with its resolution-dependent shift."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        shift=shift,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )


def build_tiny_flux_pipeline(seed: int = 0, *, blocks: tuple[int, int] = (1, 1)):
    """FLUX.1's layout: CLIP for the pooled embedding, T5 for the sequence, double and
    single stream blocks over 2 x 2 packed latents, flow-matching Euler with the
    resolution-dependent shift. No guidance embedding (as FLUX.1-schnell). `blocks`: the
    double and single stream blocks (FLUX.1's are 19 and 38)."""
    import torch
    from diffusers import FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(seed)
    (text_encoder,), tokenizer = _clip_parts(with_projection=False, count=1)
    text_encoder_2, tokenizer_2 = _t5_parts(d_model=32)
    latent_channels = 4
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=latent_channels * 4,  # 2 x 2 packed
        num_layers=blocks[0],
        num_single_layers=blocks[1],
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,  # the T5's width
        pooled_projection_dim=32,  # the CLIP's width
        axes_dims_rope=(4, 4, 8),  # sums to attention_head_dim
    )
    return FluxPipeline(
        transformer=transformer,
        scheduler=flux_scheduler(shift=1.0),
        vae=_vae(latent_channels=latent_channels),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
    )


def tiny_flux_controlnet(seed: int = 0, *, strength: float = 0.05):
    """A random-weight FLUX ControlNet for the tiny FLUX model (diffusers'
    FluxControlNetModel, shaped like its transformer: add-on family `tiny-flux`). Every
    weight is drawn from `seed`, the zero-initialised projections a trained ControlNet
    starts from included, so a control image changes what the model draws."""
    import torch
    from diffusers import FluxControlNetModel

    transformer = build_tiny_flux_pipeline(0).transformer
    controlnet = FluxControlNetModel(
        **{
            key: transformer.config[key]
            for key in (
                "patch_size",
                "in_channels",
                "num_layers",
                "num_single_layers",
                "attention_head_dim",
                "num_attention_heads",
                "joint_attention_dim",
                "pooled_projection_dim",
                "axes_dims_rope",
            )
        }
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in controlnet.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * strength)
    return controlnet


BUILDERS = {"sd3": build_tiny_sd3_pipeline, "flux": build_tiny_flux_pipeline}
