"""Quality tiers in the catalog and at the API's door: each model's tiers from its family's
defaults and its own tables, the settings a family cannot apply refused when the catalog
loads (naming the model and the tier), a tier a model does not offer a 422 listing the
ones it does, OpenAI's `quality` values mapped onto the tiers, and the share of the work
each tier is estimated at."""

from __future__ import annotations

import pytest

from app.catalog import CatalogError, load_catalog
from app.config import load_settings
from app.quality import Tier, openai_tier
from app.rules import model_limit_errors


def _catalog(tmp_path, text: str):
    path = tmp_path / "models.toml"
    path.write_text(text)
    return load_catalog(
        load_settings({"DIFFQ_HOME": str(tmp_path), "DIFFQ_MODELS_FILE": str(path)})
    )


def test_a_model_offers_its_familys_tiers_with_its_own_tables_over_them(tmp_path):
    catalog = _catalog(
        tmp_path,
        '[models.sdxl]\npath = "/m"\n'
        '[models.flux]\npath = "/f"\nfamily = "flux"\ndefault_quality = "balanced"\n'
        '[models.flux.tiers.fast]\nstep_cache = "taylorseer"\ninterval = 3\npsnr = 31.5\n'
        '[models.plain]\npath = "/p"\nquality = ["exact"]\n',
    )
    sdxl, flux, plain = (catalog.models[n] for n in ("sdxl", "flux", "plain"))
    assert sdxl.quality == ("exact", "balanced", "fast")
    assert sdxl.tier("fast").settings() == {"guidance_until": 0.5}
    assert sdxl.default_quality == "exact"
    assert flux.default_quality == "balanced"
    assert flux.tier("balanced").settings() == {
        "step_cache": "first_block",
        "threshold": 0.08,
    }
    assert flux.tier("fast").settings() == {
        "step_cache": "taylorseer",
        "interval": 3,
    }
    assert flux.tier("exact").settings() == {}
    # Measured by the operator (bench.quality), shown by GET /v1/models, not a setting.
    assert flux.tier("fast").psnr == 31.5 and flux.tier("balanced").psnr is None
    assert plain.quality == ("exact",)


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ('quality = ["exact", "ultra"]', "quality must be some of"),
        ('quality = "fast"', "quality must be a list"),
        ('quality = ["exact"]\ndefault_quality = "fast"', "default_quality must be one of"),
        (
            "[models.m.tiers.fast]\nstep_cache = 'first_block'\nthreshold = 0.1",
            "takes no step cache",
        ),
        ('family = "flux"\n[models.m.tiers.fast]\nguidance_until = 0.5', "guidance cannot be cut"),
        ("[models.m.tiers.fast]\nguidance_until = 0", "guidance_until must be in"),
        ("[models.m.tiers.fast]\nspeed = 2", "unknown keys"),
        ('quality = ["exact"]\n[models.m.tiers.fast]\nguidance_until = 0.5', "not offered"),
        ("[models.m.tiers.exact]\nguidance_until = 0.5", "exact tier"),
        ('family = "flux"\n[models.m.tiers.fast]\nthreshold = 0', "threshold must be in"),
        (
            'family = "flux"\n[models.m.tiers.fast]\nstep_cache = "taylorseer"\ninterval = 1',
            "interval must be in",
        ),
        ('family = "flux"\n[models.m.tiers.fast]\nstep_cache = "magic"', "step_cache must be one"),
        ("[models.m.tiers.fast]\npsnr = -3", "psnr must be a measured dB value"),
    ],
)
def test_tier_settings_a_model_cannot_run_are_refused_at_load(tmp_path, table, fragment):
    with pytest.raises(CatalogError, match=fragment) as refused:
        _catalog(tmp_path, f'[models.m]\npath = "/m"\n{table}\n')
    assert "model 'm'" in str(refused.value)


def test_a_tier_the_model_does_not_offer_is_refused_naming_its_tiers(tmp_path):
    catalog = _catalog(tmp_path, '[models.m]\npath = "/m"\nquality = ["exact", "balanced"]\n')
    errors = model_limit_errors(catalog.models["m"], {"quality": "fast"})
    assert errors == {"quality": ["Must be one of: exact, balanced (the tiers model 'm' offers)."]}
    assert model_limit_errors(catalog.models["m"], {"quality": "balanced"}) == {}


@pytest.mark.parametrize(
    ("asked", "offered", "tier"),
    [
        ("low", ("exact", "balanced", "fast"), "fast"),
        ("medium", ("exact", "balanced", "fast"), "balanced"),
        ("high", ("exact", "balanced", "fast"), "exact"),
        ("hd", ("exact", "fast"), "exact"),
        ("auto", ("exact", "balanced", "fast"), "balanced"),
        ("standard", ("exact", "balanced"), "balanced"),
        ("low", ("exact", "balanced"), "balanced"),  # not offered: the model's default
        ("LOW", ("exact", "fast"), "fast"),
    ],
)
def test_openai_quality_maps_onto_the_tiers(asked, offered, tier):
    assert openai_tier(asked, offered, "balanced" if "balanced" in offered else "exact") == tier


@pytest.mark.parametrize(
    ("tier", "guided", "share"),
    [
        (Tier("fast", guidance_until=0.5), True, 0.75),  # half the steps at one row of two
        (Tier("balanced", guidance_until=0.8), True, 0.9),
        (Tier("fast", guidance_until=0.5), False, 1.0),  # nothing guided: nothing to cut
        (Tier("exact"), True, 1.0),
        (Tier("fast", step_cache="first_block", threshold=0.16), True, 1.0),  # upper bound
    ],
)
def test_a_tier_is_estimated_at_the_share_of_the_work_it_does(tier, guided, share):
    assert tier.work_share(guided) == pytest.approx(share)
