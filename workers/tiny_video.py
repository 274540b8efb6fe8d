"""Tiny random-weight video pipelines: Wan 2.1 (text to video, and image to video with its
CLIP image encoder) and LTX-Video, the published architectures (causal 3D VAEs, video
diffusion transformers over patched latents, flow matching, T5 prompts) scaled down to a
few hundred kilobytes, with the offline T5 tokenizer of workers/tiny_flow.py. Nothing is
downloaded. They load back with `from_pretrained` like any saved pipeline
(workers/tiny.py `build_tiny_model`).

Sizes they take, as the real models: Wan's VAE compresses 8 x 8 pixels and 4 frames (then
2 x 2 patches), so width and height are multiples of 16 and frames 4k + 1; LTX's
compresses 32 x 32 pixels and 8 frames, so multiples of 32 and 8k + 1 frames.
"""

from __future__ import annotations

from workers.tiny_flow import _t5_parts

# The T5's width: the transformers' text_dim / caption_channels.
T5_WIDTH = 32


def _wan_scheduler():
    """Wan 2.1's own scheduler (its diffusers checkpoints' scheduler_config.json): UniPC
    over flow-matching sigmas, shift 3 (the 480p checkpoints; 720p ones use 5)."""
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(
        num_train_timesteps=1000,
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        flow_shift=3.0,
        solver_order=2,
        solver_type="bh2",
        predict_x0=True,
        lower_order_final=True,
        final_sigmas_type="zero",
        timestep_spacing="linspace",
    )


def build_tiny_wan(seed: int = 0, *, image_to_video: bool = False):
    """Wan 2.1's layout: a causal 3D VAE (8 x 8 pixels, 4 frames to a latent of 16
    channels), a transformer over 1 x 2 x 2 patches with T5 cross-attention, UniPC over
    flow sigmas. With `image_to_video`, Wan 2.1's image-to-video model: the transformer
    also takes the first frame's latents and mask (16 + 4 + 16 input channels) and a CLIP
    vision encoder's penultimate hidden states through its own key/value projections.

    As in the real one, that image attention assumes the prompt is padded to 512 tokens:
    leave `max_sequence_length` at the pipeline's default (512) when calling it."""
    import torch
    from diffusers import (
        AutoencoderKLWan,
        WanImageToVideoPipeline,
        WanPipeline,
        WanTransformer3DModel,
    )

    torch.manual_seed(seed)
    text_encoder, tokenizer = _t5_parts(d_model=T5_WIDTH)
    vae = AutoencoderKLWan(
        base_dim=3,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    )
    heads, head_dim = 2, 12
    image_width = 16  # the CLIP vision encoder's hidden size
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        in_channels=16 + 4 + 16 if image_to_video else 16,
        out_channels=16,
        text_dim=T5_WIDTH,
        freq_dim=32,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
        image_dim=image_width if image_to_video else None,
        added_kv_proj_dim=heads * head_dim if image_to_video else None,
    )
    parts = {
        "transformer": transformer,
        "vae": vae,
        "scheduler": _wan_scheduler(),
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
    }
    if not image_to_video:
        return WanPipeline(**parts)
    import transformers
    from transformers import CLIPVisionConfig, CLIPVisionModel

    image_encoder = CLIPVisionModel(
        CLIPVisionConfig(
            hidden_size=image_width,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
            projection_dim=image_width,
        )
    )
    # Shorter side to 32, centre crop 32 x 32, CLIP's mean and std: what the real
    # processor does at 224. Its PIL backend where transformers has one by name (5.x), so
    # neither building nor loading wants torchvision.
    processor_class = getattr(transformers, "CLIPImageProcessorPil", None)
    image_processor = (processor_class or transformers.CLIPImageProcessor)(
        size={"shortest_edge": 32}, crop_size=32
    )
    return WanImageToVideoPipeline(
        **parts, image_encoder=image_encoder, image_processor=image_processor
    )


def build_tiny_ltx(seed: int = 0):
    """LTX-Video's layout: a VAE that compresses 32 x 32 pixels (4 x 4 patches, then three
    spatio-temporal downsamplings) and 8 frames, a transformer over single latent
    positions with T5 cross-attention, flow-matching Euler with the resolution-dependent
    shift. One checkpoint serves text to video (`LTXPipeline`) and image to video
    (`LTXImageToVideoPipeline.from_pipe`): LTX conditions on the first frame's latents."""
    import torch
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )

    torch.manual_seed(seed)
    text_encoder, tokenizer = _t5_parts(d_model=T5_WIDTH)
    latent_channels = 8
    vae = AutoencoderKLLTXVideo(
        latent_channels=latent_channels,
        block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, True, False),
        decoder_spatio_temporal_scaling=(True, True, True, False),
        decoder_inject_noise=(False, False, False, False, False),
        patch_size=4,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    )
    transformer = LTXVideoTransformer3DModel(
        in_channels=latent_channels,
        out_channels=latent_channels,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        num_layers=2,  # two: a step cache (First Block Cache) needs a head and a tail
        caption_channels=T5_WIDTH,
    )
    # LTX-Video's scheduler_config.json: the shift grows with the sequence length
    # (1024 to 4096 positions), the last sigma stretched to 0.1. That stretch divides by
    # zero at one step (an IndexError in `step`, as with the real model): LTX needs 2+.
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=1.0,
        use_dynamic_shifting=True,
        base_shift=0.95,
        max_shift=2.05,
        base_image_seq_len=1024,
        max_image_seq_len=4096,
        shift_terminal=0.1,
    )
    return LTXPipeline(
        transformer=transformer,
        vae=vae,
        scheduler=scheduler,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
    )
