"""Quality tiers: how much exactness a client trades for speed, per request (`quality`).

- `exact`: the model as loaded, every step in full. The only tier promised byte-identical
  on replay; the default unless a model's catalog entry names another.
- `balanced`, `fast`: the same weights with training-free shortcuts, each a setting of
  the model's tier table (`[models.NAME.tiers.TIER]`), filled in from its family's
  defaults below:
  - `step_cache`: a diffusers step cache on the denoiser (`first_block`: First Block
    Cache, the later blocks skipped while the first block's residual changes by less than
    `threshold`; `taylorseer`: TaylorSeer, a full pass every `interval` steps and the ones
    between predicted). Only a transformer denoiser with diffusers' CacheMixin takes one
    (families with `step_cache`: FLUX, Wan, LTX-Video).
  - `guidance_until`: the fraction of the steps run with classifier-free guidance; the
    later ones run the conditional pass alone (half the denoiser's work on a model that
    guides). Families with `guidance_cut` (SD, SD3, Wan) where the pipeline's step
    callback reaches every guided tensor (workers/tiers.py says which).

What a tier applied to a job is recorded in its manifest; the tier is in the cache key
and in the batch key (jobs of two tiers never share a call). The worker runs a tier's
step cache on the eager denoiser (a compiled one would recompile for the hooks).

The family defaults come from published figures (First Block Cache at 0.08 on FLUX.1-dev
is about 1.5-1.8x at an LPIPS near 0.1; guidance cut for the last fifth of the steps is
diffusers' "dynamic CFG" recipe); `bench/quality.py` measures, per model and tier, the
denoiser work saved and the deviation from `exact` (PSNR) so an operator can set each
model's thresholds on its own weights. On random weights it measures numerics, not beauty.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

TIERS = ("exact", "balanced", "fast")
DEFAULT_TIER = "exact"
STEP_CACHES = ("first_block", "taylorseer")

# OpenAI's `quality` values (gpt-image-1: low, medium, high, auto; DALL-E 3: standard,
# hd) onto the tiers; None: the model's default. A tier the model does not offer gives
# its default too (an OpenAI client sends `quality` by habit, not to be refused).
OPENAI_QUALITY = {
    "low": "fast",
    "medium": "balanced",
    "high": "exact",
    "hd": "exact",
    "standard": None,
    "auto": None,
}


class TierError(ValueError):
    """A tier table that names an unknown setting or a value out of range."""


@dataclass(frozen=True)
class Tier:
    name: str
    step_cache: str = ""  # "", or one of STEP_CACHES
    threshold: float = 0.0  # first_block: the residual change under which blocks are skipped
    interval: int = 0  # taylorseer: a full pass every this many steps
    guidance_until: float = 1.0  # the fraction of steps run with guidance
    # Its deviation from `exact` as the operator measured it on these weights
    # (`bench.quality` prints the line), shown by GET /v1/models; not a setting.
    psnr: float | None = None

    @property
    def exact(self) -> bool:
        return not self.step_cache and self.guidance_until >= 1.0

    def work_share(self, guided: bool) -> float:
        """The share of `exact`'s denoiser work a job of this tier is counted at (the
        estimate): after the cut, a model that guides runs one row of its two, so
        `guidance_until` g leaves (1 + g) / 2. A step cache's saving depends on the weights
        and the prompt (`bench.quality` measures it): counted at full work, an upper bound."""
        if not guided or self.guidance_until >= 1.0:
            return 1.0
        return (1.0 + self.guidance_until) / 2

    def settings(self) -> dict[str, Any]:
        """What the tier sets (the API's `GET /v1/models` and the manifest)."""
        shown = asdict(self)
        del shown["name"], shown["psnr"]
        if self.step_cache != "first_block":
            del shown["threshold"]
        if self.step_cache != "taylorseer":
            del shown["interval"]
        if not self.step_cache:
            del shown["step_cache"]
        if self.guidance_until >= 1.0:
            del shown["guidance_until"]  # every step guided: no cut
        return shown

    def check(self, family: Any) -> None:
        """Raises TierError where the setting is unknown, out of range, or one the model
        family's pipelines cannot apply (app/families.py `step_cache`, `guidance_cut`)."""
        if self.name not in TIERS:
            raise TierError(f"tier must be one of {TIERS}, got {self.name!r}")
        if self.name == "exact" and not self.exact:
            raise TierError("the exact tier runs the model as loaded: it takes no settings")
        if self.step_cache and self.step_cache not in STEP_CACHES:
            raise TierError(f"{self.name}: step_cache must be one of {STEP_CACHES}")
        if self.step_cache and not family.step_cache:
            raise TierError(
                f"{self.name}: a {family.name} model's denoiser takes no step cache "
                "(FLUX, Wan and LTX-Video do)"
            )
        if self.step_cache == "first_block" and not 0 < self.threshold <= 1:
            raise TierError(f"{self.name}: threshold must be in (0, 1] for first_block")
        if self.step_cache == "taylorseer" and not 2 <= self.interval <= 10:
            raise TierError(f"{self.name}: interval must be in 2..10 for taylorseer")
        if not 0 < self.guidance_until <= 1:
            raise TierError(f"{self.name}: guidance_until must be in (0, 1]")
        if self.psnr is not None and not (
            isinstance(self.psnr, int | float) and 0 < self.psnr <= 200
        ):
            raise TierError(f"{self.name}: psnr must be a measured dB value in (0, 200]")
        if self.guidance_until < 1 and not family.guidance_cut:
            raise TierError(
                f"{self.name}: a {family.name} model's guidance cannot be cut on late steps "
                "(SD, SD3 and Wan models' can)"
            )


# Each family's tiers where its catalog entry sets none. A family without a shortcut
# for a tier (none here) would offer only `exact`.
FAMILY_TIERS: dict[str, dict[str, Tier]] = {
    "sd": {
        "balanced": Tier("balanced", guidance_until=0.8),
        "fast": Tier("fast", guidance_until=0.5),
    },
    "sd3": {
        "balanced": Tier("balanced", guidance_until=0.8),
        "fast": Tier("fast", guidance_until=0.5),
    },
    "flux": {
        "balanced": Tier("balanced", step_cache="first_block", threshold=0.08),
        "fast": Tier("fast", step_cache="first_block", threshold=0.16),
    },
    "wan": {
        "balanced": Tier("balanced", step_cache="first_block", threshold=0.05),
        "fast": Tier("fast", step_cache="first_block", threshold=0.1, guidance_until=0.6),
    },
    "ltx": {
        "balanced": Tier("balanced", step_cache="first_block", threshold=0.05),
        "fast": Tier("fast", step_cache="first_block", threshold=0.1),
    },
}

_TIER_KEYS = {f.name for f in fields(Tier)} - {"name"}


def model_tiers(family: str, offered: Any, tables: dict[str, Any] | None) -> tuple[Tier, ...]:
    """A model's tiers in TIERS order: those `offered` (None: exact and every one its
    family has defaults for), each its family's default with the catalog table's keys
    over it. Raises TierError for an unknown tier or key, or a tier offered with no
    settings."""
    defaults = FAMILY_TIERS.get(family, {})
    if isinstance(offered, str) or not isinstance(offered, list | tuple | None):
        raise TierError(f"quality must be a list of tiers, some of {TIERS}")
    names = tuple(offered) if offered is not None else ("exact", *defaults)
    unknown = set(names) - set(TIERS)
    if unknown:
        raise TierError(f"quality must be some of {TIERS}, got {sorted(unknown)}")
    for name in tables or {}:
        if name not in names:
            raise TierError(f"tiers.{name}: a table for a tier not offered (quality = {names})")
    made = []
    for name in TIERS:
        if name not in names:
            continue
        table = dict((tables or {}).get(name) or {})
        bad = set(table) - _TIER_KEYS
        if bad:
            known = sorted(_TIER_KEYS)
            raise TierError(f"tiers.{name}: unknown keys {sorted(bad)} (known: {known})")
        base = Tier(name) if name == "exact" else defaults.get(name)
        if base is None and not table:
            raise TierError(f"tiers.{name}: the {family} family has no default; give its settings")
        try:
            made.append(replace(base or Tier(name), **table))
        except TypeError as exc:
            raise TierError(f"tiers.{name}: {exc}") from exc
    if not made:
        raise TierError("quality must offer at least one tier")
    return tuple(made)


def openai_tier(quality: str | None, offered: tuple[str, ...], default: str) -> str:
    """The tier an OpenAI `quality` value asks for on a model offering `offered`."""
    tier = OPENAI_QUALITY.get((quality or "auto").lower())
    return tier if tier in offered else default
