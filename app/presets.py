"""Few-step presets: what a distilled model runs well with, named once in the catalog
(`preset = "lightning"`) instead of every limit spelled out. A preset fills in the
model's table keys it does not set itself (app/catalog.py); a key the table sets wins.

- `lcm`: Latent Consistency Models and LCM-LoRA: 4 steps, guidance 1 (1 to 2 work;
  more burns the image), the `lcm` scheduler's 50-step ceiling.
- `turbo`: SD-Turbo and SDXL-Turbo (adversarial diffusion distillation): 1 step, no
  guidance (they were trained without it), at most 4 steps.
- `lightning`: SDXL-Lightning: 4 steps (the 2-, 4- and 8-step checkpoints), no guidance,
  at most 8 steps. Its scheduler must space timesteps "trailing" (its `scheduler/`
  folder says so).
- `schnell`: FLUX.1-schnell (timestep distilled): 4 steps, no guidance, at most 8.

tests/worker/test_families.py runs each preset's defaults through the worker.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "lcm": {"default_steps": 4, "max_steps": 50, "default_guidance": 1.0, "max_guidance": 2.0},
    "turbo": {"default_steps": 1, "max_steps": 4, "default_guidance": 0.0, "max_guidance": 1.0},
    "lightning": {
        "default_steps": 4,
        "max_steps": 8,
        "default_guidance": 0.0,
        "max_guidance": 1.0,
    },
    "schnell": {
        "default_steps": 4,
        "max_steps": 8,
        "default_guidance": 0.0,
        "max_guidance": 1.0,
    },
}
