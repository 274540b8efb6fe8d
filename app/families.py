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


FAMILIES: dict[str, Family] = {
    "sd": Family("sd", "Stable Diffusion 1.x, 2.x, SDXL (UNet)", False, 8, None),
    "sd3": Family(
        "sd3", "Stable Diffusion 3 / 3.5 (MMDiT, flow matching)", True, 16, ("StableDiffusion3",)
    ),
    "flux": Family("flux", "FLUX.1 (flow matching)", True, 16, ("Flux",)),
}
DEFAULT_FAMILY = "sd"


def family_of_pipeline(class_name: str) -> str:
    """The family a diffusers pipeline class belongs to."""
    for family in FAMILIES.values():
        if family.class_prefixes and class_name.startswith(family.class_prefixes):
            return family.name
    return DEFAULT_FAMILY
