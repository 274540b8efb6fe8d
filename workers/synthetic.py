"""A stand-in pipeline whose "denoise" takes a fixed time and returns a real image.

For measuring what the service costs around a GPU (bench/duty.py): it sleeps (releasing the
GIL, as a GPU-bound pipeline does while kernels run) step by step, calls the step callback
like diffusers does, and returns a photo-like PNG-sized image of the requested size.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any


def photo_like(width: int, height: int, seed: int = 0) -> Any:
    """Smooth gradients with grain: compresses like a photograph, not like noise or a flat
    colour, so PNG encoding costs what it costs for real results."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack(
        [
            128 + 100 * np.sin(x / 97 + seed),
            128 + 100 * np.cos(y / 131),
            128 + 90 * np.sin((x + y) / 173),
        ],
        axis=-1,
    )
    grain = rng.normal(0, 6, size=base.shape)
    return Image.fromarray(np.clip(base + grain, 0, 255).astype(np.uint8), "RGB")


class SyntheticPipeline:
    """Callable like a diffusers text-to-image pipeline; `busy_seconds` sums its runs."""

    def __init__(self, seconds_per_image: float) -> None:
        from diffusers import DDIMScheduler

        self.seconds_per_image = seconds_per_image
        self.scheduler = DDIMScheduler()
        self.num_timesteps = 0
        self._busy = [0.0]
        self._images: dict[tuple[int, int], Any] = {}

    @property
    def busy_seconds(self) -> float:
        return self._busy[0]

    @busy_seconds.setter
    def busy_seconds(self, value: float) -> None:
        self._busy[0] = value

    def set_progress_bar_config(self, **_kwargs) -> None:
        pass

    def __call__(
        self,
        *,
        width: int,
        height: int,
        num_inference_steps: int,
        num_images_per_prompt: int = 1,
        callback_on_step_end=None,
        **_kwargs,
    ):
        started = time.perf_counter()
        self.num_timesteps = num_inference_steps
        per_step = self.seconds_per_image * num_images_per_prompt / num_inference_steps
        deadline = started
        try:
            for step in range(num_inference_steps):
                deadline += per_step
                time.sleep(max(0.0, deadline - time.perf_counter()))
                if callback_on_step_end is not None:
                    callback_on_step_end(self, step, step, {})
        finally:
            self._busy[0] += time.perf_counter() - started
        key = (width, height)
        if key not in self._images:
            self._images[key] = photo_like(width, height)
        return SimpleNamespace(
            images=[self._images[key].copy() for _ in range(num_images_per_prompt)],
            nsfw_content_detected=None,
        )
