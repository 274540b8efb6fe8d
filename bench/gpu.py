"""Bare diffusers loop vs the same work through diffq's worker path, on SD 1.5 and SDXL.

    .venv/bin/python -m bench.gpu [--images 8] [--steps 20 30] [--models sd15 sdxl] [--compile]

The pipelines are architecture-true with random weights, built from the published SD 1.5
(512²) and SDXL (1024²) configurations: the same layers and FLOPs as the real models, no
weights to download. On a CUDA GPU they run in full, in fp16. On a CPU they run scaled down
(every width ÷ 10, depths kept, 64² and 128², 2 and 3 steps) so that CI keeps the bench
honest; CPU figures say nothing about a GPU.

"through diffq" runs the embedded mode (SQLite, local files, no server): the pipeline is
saved, loaded by the worker's own loader and each job goes through workers.execute
(claim, progress, lease, PNG encode, store, outcome), back to back as a pool process runs
them. Duty = generation seconds / wall seconds. Only torch, diffusers and transformers are
needed beyond diffq itself.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path

from bench.report import percentile, print_table


def _text_encoder(cls_name: str, hidden: int, layers: int, heads: int, vocab: dict, act: str):
    import transformers

    config = transformers.CLIPTextConfig(
        bos_token_id=vocab["<|startoftext|>"],
        eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<|endoftext|>"],
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_attention_heads=heads,
        num_hidden_layers=layers,
        vocab_size=len(vocab),
        max_position_embeddings=77,
        projection_dim=hidden,
        hidden_act=act,
    )
    return getattr(transformers, cls_name)(config)


def _vae(scale: int, sample_size: int, force_upcast: bool):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=[max(32, c // scale // 32 * 32) for c in (128, 256, 512, 512)],
        layers_per_block=2,
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        latent_channels=4,
        sample_size=sample_size,
        force_upcast=force_upcast,
    )


def build(family: str, scale: int):
    """SD 1.5 or SDXL with random weights; `scale` divides every width (1: the real size)."""
    import torch
    from diffusers import (
        EulerDiscreteScheduler,
        PNDMScheduler,
        StableDiffusionPipeline,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTokenizer

    from workers.tiny import _tokenizer_files

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file, merges_file, vocab = _tokenizer_files(Path(tmp))
        tokenizer = CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=77)
    channels = [c // scale for c in (320, 640, 1280, 1280)]
    if family == "sd15":
        clip_l = 768 // scale
        unet = UNet2DConditionModel(
            sample_size=64,
            layers_per_block=2,
            block_out_channels=channels,
            down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
            up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
            cross_attention_dim=clip_l,
            attention_head_dim=8,
        )
        return StableDiffusionPipeline(
            vae=_vae(scale, 512, force_upcast=False),
            text_encoder=_text_encoder(
                "CLIPTextModel", clip_l, 12, max(1, 12 // scale), vocab, "quick_gelu"
            ),
            tokenizer=tokenizer,
            unet=unet,
            scheduler=PNDMScheduler(
                beta_start=0.00085,
                beta_end=0.012,
                beta_schedule="scaled_linear",
                skip_prk_steps=True,
                steps_offset=1,
            ),
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
    clip_l, clip_g, time_dim = 768 // scale, 1280 // scale, 256 // scale
    heads = (5, 10, 20) if scale == 1 else (1, 2, 4)
    unet = UNet2DConditionModel(
        sample_size=128,
        layers_per_block=2,
        block_out_channels=channels[:3],
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2, 10),
        attention_head_dim=heads,
        cross_attention_dim=clip_l + clip_g,
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=time_dim,
        projection_class_embeddings_input_dim=6 * time_dim + clip_g,
    )
    return StableDiffusionXLPipeline(
        vae=_vae(scale, 1024, force_upcast=False),  # as with the fp16-fix VAE: no upcast
        text_encoder=_text_encoder(
            "CLIPTextModel", clip_l, 12, max(1, 12 // scale), vocab, "quick_gelu"
        ),
        text_encoder_2=_text_encoder(
            "CLIPTextModelWithProjection", clip_g, 32, max(1, 20 // scale), vocab, "gelu"
        ),
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        unet=unet,
        scheduler=EulerDiscreteScheduler(
            beta_start=0.00085,
            beta_end=0.012,
            beta_schedule="scaled_linear",
            steps_offset=1,
            timestep_spacing="leading",
        ),
    )


MODELS_TOML = """\
[models.{name}]
path = "{path}"
dtype = "{dtype}"
min_size = {size}
max_width = {size}
max_height = {size}
max_pixels = {pixels}
default_width = {size}
default_height = {size}
max_steps = 100
default_steps = 20
soft_time_limit = 1200
time_limit = 1300
"""


def _bare(pipeline, device: str, size: int, steps: int, images: int) -> list[float]:
    import torch

    seconds = []
    for i in range(images + 1):  # the first run is a warm-up
        generator = torch.Generator(device=device).manual_seed(i)
        started = time.perf_counter()
        with torch.inference_mode():
            pipeline(
                "a red cube",
                width=size,
                height=size,
                num_inference_steps=steps,
                generator=generator,
            )
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return seconds[1:]


def _through_diffq(home: Path, name: str, size: int, steps: int, images: int, compiled: bool):
    """Jobs through workers.execute on an embedded runtime; per-job seconds, wall, busy."""
    from app.broker.payload import build_payload
    from app.config import load_settings
    from app.db.migrate import upgrade
    from app.jobs.service import create_job
    from app.jobs.states import Priority
    from app.keys import get_or_create_tenant
    from app.kinds import request_from_stored
    from app.services import Services
    from workers import call, execute
    from workers.runtime import build_runtime

    settings = load_settings()
    upgrade(settings.database_url)
    rt = build_runtime(Services(settings), [f"gpu.{name}"])
    model = rt.models[name]
    if compiled:
        import torch

        model.pipeline.unet = torch.compile(model.pipeline.unet)
    busy = [0.0]
    generate = call.generate

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            busy[0] += time.perf_counter() - started

    call.generate = timed
    try:
        with rt.db.session() as session:
            tenant = get_or_create_tenant(session, f"bench-{uuid.uuid4().hex[:6]}")
            payloads = []
            for i in range(images + 1):
                params = {
                    "prompt": "a red cube",
                    "negative_prompt": None,
                    "model": name,
                    "width": size,
                    "height": size,
                    "steps": steps,
                    "guidance_scale": 7.5,
                    "seed": i,
                    "num_images": 1,
                    "scheduler": "default",
                    "output_format": "png",
                    "priority": "normal",
                }
                job = create_job(
                    session,
                    tenant.id,
                    model=name,
                    queue=f"gpu.{name}",
                    priority=Priority.NORMAL,
                    request=request_from_stored(params),
                    metadata=None,
                )
                payloads.append(build_payload(job))
        execute.execute_job(rt, payloads[0], redelivered=False)  # warm-up
        if rt.postprocessor is not None:
            rt.postprocessor.drain()
        busy[0] = 0.0
        per_job = []
        started = time.perf_counter()
        for payload in payloads[1:]:
            job_started = time.perf_counter()
            execute.execute_job(rt, payload, redelivered=False)
            per_job.append(time.perf_counter() - job_started)
        if rt.postprocessor is not None:
            rt.postprocessor.drain()
        wall = time.perf_counter() - started
    finally:
        call.generate = generate
        rt.db.dispose()
    return per_job, wall, busy[0]


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["sd15", "sdxl"])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--steps", type=int, nargs="+")
    parser.add_argument("--compile", action="store_true", help="also run with torch.compile")
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    if not gpu:
        # A shared CPU: oversubscribed OpenMP threads only spin (the worker's runtime reads
        # OMP_NUM_THREADS too).
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"
    device, dtype = ("cuda", torch.float16) if gpu else ("cpu", torch.float32)
    scale = 1 if gpu else 10
    steps_list = args.steps or ([20, 30] if gpu else [2, 3])
    sizes = {"sd15": 512, "sdxl": 1024} if gpu else {"sd15": 64, "sdxl": 128}
    where = torch.cuda.get_device_name(0) if gpu else "CPU (scaled down: widths / 10)"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ.update(
            {
                "DIFFQ_HOME": str(root / "home"),
                "DIFFQ_MODELS_FILE": str(root / "models.toml"),
                "DIFFQ_DEVICE": device,
                "DIFFQ_WORKER_METRICS_PORT": "0",
            }
        )
        for key in ("DIFFQ_DATABASE_URL", "DIFFQ_BROKER_URL", "DIFFQ_STORAGE_URL"):
            os.environ.pop(key, None)
        tables = []
        for family in args.models:
            size = sizes[family]
            path = root / family
            build(family, scale).save_pretrained(path)
            tables.append(
                MODELS_TOML.format(
                    name=family,
                    path=path,
                    size=size,
                    pixels=size * size,
                    dtype="float16" if gpu else "float32",
                )
            )
        (root / "models.toml").write_text("\n".join(tables))
        for family in args.models:
            size = sizes[family]
            from diffusers import DiffusionPipeline

            pipeline = DiffusionPipeline.from_pretrained(str(root / family), dtype=dtype).to(device)
            pipeline.set_progress_bar_config(disable=True)
            for compiled in [False, True] if args.compile else [False]:
                if compiled:
                    pipeline.unet = torch.compile(pipeline.unet)
                for steps in steps_list:
                    bare = _bare(pipeline, device, size, steps, args.images)
                    per_job, wall, busy = _through_diffq(
                        root, family, size, steps, args.images, compiled
                    )
                    common = {
                        "model": family,
                        "size": size,
                        "steps": steps,
                        "compiled": "yes" if compiled else "no",
                    }
                    rows.append(
                        {
                            **common,
                            "path": "bare diffusers",
                            "images/s": len(bare) / sum(bare),
                            "p50 ms": percentile(bare, 50) * 1000,
                            "p99 ms": percentile(bare, 99) * 1000,
                            "duty %": 100.0,
                        }
                    )
                    rows.append(
                        {
                            **common,
                            "path": "through diffq",
                            "images/s": len(per_job) / wall,
                            "p50 ms": percentile(per_job, 50) * 1000,
                            "p99 ms": percentile(per_job, 99) * 1000,
                            "duty %": 100 * busy / wall,
                        }
                    )
                    rows[-1]["vs bare %"] = 100 * rows[-1]["images/s"] / rows[-2]["images/s"]
                    print(rows[-2], rows[-1], sep="\n", flush=True)
    print_table(
        f"{where}, {'fp16' if gpu else 'fp32'}, {args.images} images per row",
        rows,
        [
            "model",
            "size",
            "steps",
            "compiled",
            "path",
            "images/s",
            "p50 ms",
            "p99 ms",
            "duty %",
            "vs bare %",
        ],
    )


if __name__ == "__main__":
    main()
