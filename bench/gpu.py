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
them. Duty = generation seconds / wall seconds. A row's bare images are taken half
before and half after its diffq jobs, so a drift of the GPU's clocks or the host's load
weighs on both paths alike; each job has its own prompt (no conditioning cache hit). Only
torch, diffusers and transformers are needed beyond diffq itself.
"""

from __future__ import annotations

import argparse
import contextlib
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


def _vae(scale: int, sample_size: int, force_upcast: bool = True, **config):
    """The published VAEs' layout (SD's 4 latent channels unless `config` says more)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=[max(32, c // scale // 32 * 32) for c in (128, 256, 512, 512)],
        layers_per_block=2,
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        sample_size=sample_size,
        force_upcast=force_upcast,
        **{"latent_channels": 4, **config},
    )


def build(family: str, scale: int, device: str = "cpu"):
    """SD 1.5 or SDXL with random weights; `scale` divides every width (1: the real size).
    Made on `device`: a GPU draws SDXL's 3.5 billion random weights in a fraction of the
    time the CPU takes (what the pipeline is saved and loaded from is the same either way)."""
    import torch

    with torch.device(device):
        return _build(family, scale)


def _build(family: str, scale: int):
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


def build_flux_dev(scale: int, device: str = "cpu", dtype=None):
    """FLUX.1-dev with random weights in its published layout (scale 1): 19 double and 38
    single stream blocks of 24 heads x 128, guidance embedding, T5-XXL (4096 wide, 24
    layers) and CLIP-L text encoders, the 16-channel VAE, flow-matching Euler with the
    resolution-dependent shift. `scale` > 1 divides the widths (blocks and depths kept: a
    CPU's dry run). Made on `device` in `dtype` (bf16 on a GPU: 12 billion weights drawn
    there in seconds, never held in fp32). The tokenizers are offline stand-ins
    (workers/tiny_flow.py): token ids index the published vocabularies."""
    import torch
    import transformers
    from diffusers import FluxPipeline, FluxTransformer2DModel

    from workers.tiny_flow import _clip_parts, _t5_parts, flux_scheduler

    (_,), clip_tokenizer = _clip_parts(with_projection=False, count=1)
    _, t5_tokenizer = _t5_parts()
    vocab = clip_tokenizer.get_vocab()
    heads, head_dim = (24, 128) if scale == 1 else (2, 16)
    axes = (16, 56, 56) if scale == 1 else (4, 4, 8)
    t5_width, clip_width = 4096 // scale, 768 // scale
    previous = torch.get_default_dtype()
    torch.manual_seed(0)
    try:
        torch.set_default_dtype(dtype or torch.float32)
        with torch.device(device):
            transformer = FluxTransformer2DModel(
                patch_size=1,
                in_channels=64,
                num_layers=19,
                num_single_layers=38,
                attention_head_dim=head_dim,
                num_attention_heads=heads,
                joint_attention_dim=t5_width,
                pooled_projection_dim=clip_width,
                guidance_embeds=True,
                axes_dims_rope=axes,
            )
            text_encoder = transformers.CLIPTextModel(
                transformers.CLIPTextConfig(
                    bos_token_id=vocab["<|startoftext|>"],
                    eos_token_id=vocab["<|endoftext|>"],
                    pad_token_id=vocab["<|endoftext|>"],
                    hidden_size=clip_width,
                    intermediate_size=clip_width * 4,
                    num_attention_heads=max(1, 12 // scale),
                    num_hidden_layers=12,
                    vocab_size=49408,
                    max_position_embeddings=77,
                    hidden_act="quick_gelu",
                )
            )
            text_encoder_2 = transformers.T5EncoderModel(
                transformers.T5Config(
                    vocab_size=32128,
                    d_model=t5_width,
                    d_kv=64 if scale == 1 else 16,
                    d_ff=10240 // scale,
                    num_layers=24,
                    num_heads=64 if scale == 1 else 4,
                    feed_forward_proj="gated-gelu",
                    pad_token_id=0,
                    eos_token_id=1,
                )
            )
            vae = _vae(
                scale,
                1024,
                latent_channels=16,
                use_quant_conv=False,
                use_post_quant_conv=False,
                shift_factor=0.1159,
                scaling_factor=0.3611,
            )
    finally:
        torch.set_default_dtype(previous)
    return FluxPipeline(
        transformer=transformer,
        scheduler=flux_scheduler(shift=3.0),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=clip_tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=t5_tokenizer,
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


def _bare(
    pipeline, device: str, size: int, steps: int, images: int, around=contextlib.nullcontext
) -> list[float]:
    """Seconds of each bare call after a warm-up; `around()` is entered around each timed one
    (bench/step_profile.py profiles there)."""
    import torch

    seconds = []
    for i in range(images + 1):  # the first run is a warm-up
        generator = torch.Generator(device=device).manual_seed(i)
        started = time.perf_counter()
        with torch.inference_mode(), around() if i else contextlib.nullcontext():
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


class DiffqPath:
    """diffq's worker on an embedded runtime (SQLite, local files, no server) serving one
    model: `job()` runs one job through workers.execute (claim, progress, the pipeline call,
    PNG encode and store, overlapped, and the outcome), as a pool process runs them back to
    back; `call()` runs the worker's one pipeline call alone (workers.call.generate on the
    same loaded model: no database, no thread beside it). `busy` sums the seconds spent
    inside the pipeline call by jobs."""

    def __init__(self, name: str, size: int, steps: int, compiled: bool) -> None:
        from app.config import load_settings
        from app.db.migrate import upgrade
        from app.keys import get_or_create_tenant
        from app.services import Services
        from workers import call
        from workers.runtime import build_runtime

        settings = load_settings()
        upgrade(settings.database_url)
        self.name, self.size, self.steps = name, size, steps
        self.rt = build_runtime(Services(settings), [f"gpu.{name}"])
        self.model = self.rt.models[name]
        if compiled:
            import torch

            self.model.pipeline.unet = torch.compile(self.model.pipeline.unet)
        with self.rt.db.session() as session:
            self.tenant = get_or_create_tenant(session, f"bench-{uuid.uuid4().hex[:6]}").id
        self.busy = 0.0
        self._taken = 0
        self._generate = call.generate

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return self._generate(*args, **kwargs)
            finally:
                self.busy += time.perf_counter() - started

        call.generate = timed

    def _params(self) -> dict:
        self._taken += 1
        return {
            # each its own prompt: no conditioning cache hit
            "prompt": f"a red cube, take {self._taken}",
            "negative_prompt": None,
            "model": self.name,
            "width": self.size,
            "height": self.size,
            "steps": self.steps,
            "guidance_scale": 7.5,
            "seed": self._taken,
            "num_images": 1,
            "scheduler": "default",
            "output_format": "png",
            "priority": "normal",
        }

    def job(self, around=contextlib.nullcontext) -> float:
        """One job's seconds from its message to its outcome (the message made untimed)."""
        from app.broker.payload import build_payload
        from app.jobs.service import create_job
        from app.jobs.states import Priority
        from app.kinds import request_from_stored
        from workers import execute

        with self.rt.db.session() as session:
            job = create_job(
                session,
                self.tenant,
                model=self.name,
                queue=f"gpu.{self.name}",
                priority=Priority.NORMAL,
                request=request_from_stored(self._params()),
                metadata=None,
            )
            payload = build_payload(job)
        started = time.perf_counter()
        with around():
            execute.execute_job(self.rt, payload, redelivered=False)
        return time.perf_counter() - started

    def call(self, around=contextlib.nullcontext) -> float:
        """The worker's pipeline call alone: seconds."""
        from app.kinds import KINDS

        params = self._params()
        fields = ("prompt", "width", "height", "steps", "guidance_scale", "seed")
        job = KINDS["txt2img"].normalize(self.model.spec, {k: params[k] for k in fields})
        started = time.perf_counter()
        with around():
            self._generate(self.model, [job], on_step=[lambda *_: True])
        return time.perf_counter() - started

    def drain(self) -> None:
        if self.rt.postprocessor is not None:
            self.rt.postprocessor.drain()

    def close(self) -> None:
        from workers import call

        self.drain()
        call.generate = self._generate
        self.rt.close()


def _through_diffq(name: str, size: int, steps: int, images: int, compiled: bool):
    """Jobs through diffq after a warm-up job: per-job seconds, wall, busy (seconds inside
    the pipeline call)."""
    path = DiffqPath(name, size, steps, compiled)
    try:
        path.job()  # warm-up
        path.drain()
        path.busy = 0.0
        started = time.perf_counter()
        per_job = [path.job() for _ in range(images)]
        path.drain()
        wall = time.perf_counter() - started
        return per_job, wall, path.busy
    finally:
        path.close()


def embedded_environment(root: Path, device: str) -> None:
    """The worker's settings for an embedded runtime under `root` (its models.toml there)."""
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
        embedded_environment(root, device)
        tables = []
        for family in args.models:
            size = sizes[family]
            path = root / family
            build(family, scale, device).to(dtype).save_pretrained(path)
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
                    # bare, diffq, bare: the bare rate is both halves', so a drift of the
                    # GPU's clocks or the host's load over the row weighs on both paths alike
                    first = args.images // 2
                    bare = _bare(pipeline, device, size, steps, first)
                    per_job, wall, busy = _through_diffq(family, size, steps, args.images, compiled)
                    bare += _bare(pipeline, device, size, steps, args.images - first)
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
