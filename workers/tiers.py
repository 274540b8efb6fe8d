"""A call's quality tier on the worker (app/quality.py): the step cache put on the
denoiser for the call and taken off after it, and classifier-free guidance cut after a
step. Nothing of it outlives the call: the next call, of any tier, finds the model as
loaded (tests/worker/test_tiers.py).

What the call applied is what the job's manifest records (`TierCall.applied`): a tier
setting the pipeline cannot apply is left out of it, not pretended (a guidance cut where
the step callback cannot reach every guided tensor: a ControlNet's, an LCM UNet's, SD3's
image-to-image; or a job whose guidance scale guides nothing).
"""

from __future__ import annotations

from typing import Any

from app.families import FAMILIES
from app.quality import Tier
from workers.compiled import denoiser_name
from workers.rows import row_inputs


class TierUnavailable(RuntimeError):
    """A tier's step cache cannot be put on this model's denoiser."""


def check_tiers(pipeline: Any, tiers: tuple[Tier, ...]) -> None:
    """Each tier's step cache put on the denoiser and taken off again, once, when the
    model loads: one that cannot be (a transformer of one block has no head and tail for
    First Block Cache) stops the load rather than a job that asked for the tier."""
    for tier in tiers:
        if not tier.step_cache:
            continue
        call = TierCall(pipeline, tier, "")
        if not call.caching:
            raise TierUnavailable(f"tier {tier.name}: the denoiser takes no step cache")
        try:
            call.denoiser.enable_cache(call._cache_config())
        except Exception as exc:
            raise TierUnavailable(
                f"tier {tier.name}: {tier.step_cache} cannot be put on this denoiser "
                f"({type(exc).__name__}: {exc or 'too few transformer blocks'})"
            ) from exc
        call.denoiser.disable_cache()


class TierCall:
    """One call's tier: `with` it around the pipeline call; `step` from its step
    callback, before anything else reads the tensors."""

    def __init__(self, pipeline: Any, tier: Tier, family: str, steps_hint: int = 0) -> None:
        self.pipeline = pipeline
        self.tier = tier
        self.denoiser = getattr(pipeline, denoiser_name(pipeline) or "", None)
        self.caching = bool(tier.step_cache) and hasattr(self.denoiser, "enable_cache")
        how = FAMILIES[family].guidance_cut if family in FAMILIES else ""
        reachable = how == "separate" or (how == "batched" and row_inputs(pipeline) is not None)
        self.cutting = tier.guidance_until < 1 and reachable
        self.cut_after: int | None = None  # the step after which guidance was cut
        self._context: Any = None

    @property
    def compiled_ok(self) -> bool:
        """A compiled denoiser would recompile for the cache's hooks: run it eager."""
        return not self.caching

    def tensor_inputs(self, base: list[str]) -> list[str]:
        """The step callback's tensors: with a guidance cut, every one the pipeline hands
        it (the guided halves of each are dropped at the cut)."""
        if not self.cutting:
            return base
        allowed = list(getattr(self.pipeline, "_callback_tensor_inputs", ()))
        return base + [name for name in allowed if name not in base]

    def __enter__(self) -> TierCall:
        if self.caching:
            self.denoiser.enable_cache(self._cache_config())
            # Pipelines that do not name a cache context (FLUX's image-to-image, inpainting
            # and ControlNet ones) run in this one; those that do set theirs inside it.
            self._context = self.denoiser.cache_context("cond")
            self._context.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.caching:
            try:
                self._context.__exit__(None, None, None)
            finally:
                self.denoiser.disable_cache()

    def _cache_config(self) -> Any:
        from diffusers.hooks import FirstBlockCacheConfig, TaylorSeerCacheConfig

        if self.tier.step_cache == "first_block":
            return FirstBlockCacheConfig(threshold=self.tier.threshold)
        return TaylorSeerCacheConfig(cache_interval=self.tier.interval)

    def step(self, pipe: Any, step: int, total: int, kwargs: dict[str, Any], rows: int) -> dict:
        """After step `step` of `total`: at the tier's cut, guidance off for the steps
        left, each guided tensor ([unconditional; conditional] rows) halved to its
        conditional rows."""
        if not self.cutting or self.cut_after is not None or step >= total:
            return kwargs
        if step < max(1, round(self.tier.guidance_until * total)):
            return kwargs
        if not getattr(pipe, "do_classifier_free_guidance", False):
            self.cutting = False  # nothing guided to cut
            return kwargs
        import torch

        out = {}
        for name, value in kwargs.items():
            if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == 2 * rows:
                value = value[rows:]
            out[name] = value
        pipe._guidance_scale = 1.0
        self.cut_after = step
        return out

    def applied(self) -> dict[str, Any]:
        """The manifest's `quality`: the tier, and the settings the call applied."""
        shown: dict[str, Any] = {"tier": self.tier.name}
        settings = self.tier.settings()
        if self.caching:
            shown.update({k: v for k, v in settings.items() if k != "guidance_until"})
        if self.cut_after is not None:
            shown["guidance_until"] = self.tier.guidance_until
            shown["guided_steps"] = self.cut_after
        return shown
