"""Model families: what a model's architecture decides for the API before any weight is
read. The catalog names a model's family (`family = "flux"`); the worker checks it
against the pipeline class in the model's model_index.json before loading
(workers/pipelines.py `check_model_dir`), so a request the API accepts for a family is
one the loaded pipeline can run.

- `sd`: Stable Diffusion 1.x/2.x and SDXL (and their LCM, Turbo and Lightning
  distillations): a UNet denoising a discrete noise schedule; the schedulers of that kind.
- `sd3`: Stable Diffusion 3 / 3.5, `flux`: FLUX.1: a transformer trained for flow
  matching; only flow-matching schedulers fit (app/rules.py `Scheduler.flow`). Their
  latents are patched 2 x 2 over a VAE that downsamples by 8, so sizes are multiples of 16.
- `wan`: Wan 2.1 / 2.2 video (`WanPipeline`, `WanImageToVideoPipeline`): a video VAE that
  downsamples by 8 in space and 4 in time, latents patched 2 x 2: sizes are multiples of 16
  and a clip has 4k + 1 frames. A text-to-video and an image-to-video checkpoint are two
  models (the image-to-video transformer takes the first frame's channels too).
- `ltx`: LTX-Video (`LTXPipeline`, `LTXImageToVideoPipeline`): a VAE that downsamples by 32
  in space and 8 in time: sizes are multiples of 32, a clip has 8k + 1 frames; one
  checkpoint runs both kinds.

A video family's pipeline class per job kind is `pipelines` (an image family's kinds use the
AutoPipelines of app/kinds).

Add-on weights (LoRA adapters, ControlNets) attach to layers whose widths a model's
architecture fixes, so each declares an add-on family (`ADDON_FAMILIES`: sd15, sd2, sdxl,
flux, and the tiny test models' tiny and tiny-flux), the same one a model declares in its
catalog entry (`lora_family`). An add-on family belongs to one model family, and says
whether LoRA adapters of it are taken here (every one of today's does: a FLUX model takes
LoRA adapters on its transformer, and ControlNets of `controlnet_class`,
FluxControlNetModel).

tests/worker/test_families.py runs a tiny random-weight pipeline of each family
(workers/tiny.py) with every scheduler its family offers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    summary: str
    flow: bool  # trained for flow matching: only flow-matching schedulers fit
    size_multiple: int  # a model's size_multiple must be a multiple of this
    # The diffusers pipeline class names (model_index.json `_class_name`) start with one
    # of these; None: any pipeline no other family claims.
    class_prefixes: tuple[str, ...] | None
    # Video: a clip's frame count is `frame_step` k + 1 (the VAE's temporal compression).
    video: bool = False
    frame_step: int = 1
    default_fps: int = 24  # the frame rate it was trained at (video)
    # The fewest steps its scheduler runs (LTX-Video's stretches its sigmas to a terminal
    # value, which one step divides by zero).
    min_steps: int = 1
    # The job kinds a model of this family offers unless its catalog entry says otherwise.
    kinds: tuple[str, ...] = ("txt2img", "img2img", "inpaint")
    # The diffusers pipeline class each kind runs on, where it is not the kind's
    # AutoPipeline (video families: diffusers has no video AutoPipeline).
    pipelines: tuple[tuple[str, str], ...] = ()
    # The diffusers class of its ControlNets; None: it takes none (docs/controls.md).
    controlnet_class: str | None = None
    # Quality tiers (app/quality.py): a step cache fits its denoiser (a transformer with
    # diffusers' CacheMixin); how its guidance is cut on late steps: "batched" (the
    # unconditional rows ride in the same tensors, halved at the cut where the step
    # callback reaches them all: workers/rows.py), "separate" (a pass of its own, left
    # out), or "" (it cannot be).
    step_cache: bool = False
    guidance_cut: str = ""
    # Its transformer's attention goes through diffusers' dispatcher, so a catalog's
    # `attention_backend` (FlashAttention 3, SageAttention, …) applies to it; a UNet's and
    # SD3's processors call PyTorch's SDPA themselves.
    attention_dispatch: bool = False

    def pipeline_for(self, kind: str) -> str | None:
        return dict(self.pipelines).get(kind)

    def frames_fit(self, frames: int) -> bool:
        return frames >= 1 and (frames - 1) % self.frame_step == 0


FAMILIES: dict[str, Family] = {
    "sd": Family(
        "sd",
        "Stable Diffusion 1.x, 2.x, SDXL (UNet)",
        False,
        8,
        None,
        controlnet_class="ControlNetModel",
        guidance_cut="batched",
    ),
    "sd3": Family(
        "sd3",
        "Stable Diffusion 3 / 3.5 (MMDiT, flow matching)",
        True,
        16,
        ("StableDiffusion3",),
        guidance_cut="batched",
    ),
    "flux": Family(
        "flux",
        "FLUX.1 (flow matching)",
        True,
        16,
        ("Flux",),
        controlnet_class="FluxControlNetModel",
        step_cache=True,
        attention_dispatch=True,
    ),
    "wan": Family(
        "wan",
        "Wan 2.1 / 2.2 video (flow matching; 4k + 1 frames)",
        True,
        16,
        ("Wan",),
        video=True,
        frame_step=4,
        default_fps=16,
        kinds=("txt2vid",),
        pipelines=(("txt2vid", "WanPipeline"), ("img2vid", "WanImageToVideoPipeline")),
        step_cache=True,
        guidance_cut="separate",
        attention_dispatch=True,
    ),
    "ltx": Family(
        "ltx",
        "LTX-Video (flow matching; 8k + 1 frames)",
        True,
        32,
        ("LTX",),
        video=True,
        frame_step=8,
        min_steps=2,
        kinds=("txt2vid", "img2vid"),
        pipelines=(("txt2vid", "LTXPipeline"), ("img2vid", "LTXImageToVideoPipeline")),
        step_cache=True,
        attention_dispatch=True,
    ),
}
DEFAULT_FAMILY = "sd"


@dataclass(frozen=True)
class AddonFamily:
    """The widths add-on weights attach to: `model_family`'s models of one size."""

    name: str
    model_family: str  # FAMILIES
    loras: bool  # LoRA adapters of it are taken (app/addons/lora/checks.py FAMILIES: their widths)


ADDON_FAMILIES: dict[str, AddonFamily] = {
    a.name: a
    for a in (
        AddonFamily("sd15", "sd", True),
        AddonFamily("sd2", "sd", True),
        AddonFamily("sdxl", "sd", True),
        AddonFamily("tiny", "sd", True),  # workers/tiny.py
        AddonFamily("flux", "flux", True),
        AddonFamily("tiny-flux", "flux", True),  # workers/tiny_flow.py
    )
}


def family_of_pipeline(class_name: str) -> str:
    """The family a diffusers pipeline class belongs to."""
    for family in FAMILIES.values():
        if family.class_prefixes and class_name.startswith(family.class_prefixes):
            return family.name
    return DEFAULT_FAMILY
