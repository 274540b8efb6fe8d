"""The models file: defaults, per-model limits, and refusals of unsafe settings."""

from __future__ import annotations

import pytest

from app.catalog import CatalogError, load_catalog
from app.config import load_settings


def _catalog(tmp_path, text: str):
    path = tmp_path / "models.toml"
    path.write_text(text)
    return load_catalog(
        load_settings({"DIFFQ_HOME": str(tmp_path), "DIFFQ_MODELS_FILE": str(path)})
    )


def test_without_a_models_file_the_tiny_models_are_served(tmp_path):
    catalog = load_catalog(load_settings({"DIFFQ_HOME": str(tmp_path)}))
    assert catalog.default_model == "tiny"
    assert catalog.get(None).path == tmp_path / "models" / "tiny"
    video = catalog.get("tiny-video")
    assert video.path == tmp_path / "models" / "tiny-video"
    assert video.video and video.kinds == ("txt2vid", "img2vid")
    assert catalog.queues == ["gpu.tiny", "gpu.tiny-video"]


def test_entries_get_their_own_queue_and_relative_paths_resolve(tmp_path):
    catalog = _catalog(
        tmp_path,
        '[models.sdxl]\npath = "weights/sdxl"\nmax_steps = 60\n'
        '[models.turbo]\npath = "/srv/turbo"\nqueue = "gpu.fast"\n',
    )
    assert catalog.default_model == "sdxl"
    assert catalog.models["sdxl"].queue == "gpu.sdxl"
    assert catalog.models["sdxl"].path == tmp_path / "weights" / "sdxl"
    assert catalog.models["sdxl"].max_steps == 60
    assert catalog.queues == ["gpu.fast", "gpu.sdxl"]
    assert [m.name for m in catalog.models_for_queues(["gpu.fast"])] == ["turbo"]


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        (
            'path = "/m"\ntime_limit = 1700\nsoft_time_limit = 1600\ncheckpoint_seconds = 0',
            "consumer_timeout",
        ),
        (
            'path = "/m"\ntime_limit = 1700\nsoft_time_limit = 1600\nmax_batch = 2',
            "consumer_timeout",
        ),
        ('path = "/m"\nsoft_time_limit = 700\ntime_limit = 600', "soft_time_limit < time_limit"),
        ('path = "/m"\ndtype = "int8"', "dtype"),
        ('path = "/m"\nwidth = 512', "unknown keys"),
        ('queue = "q"', "path is required"),
        ('path = "/m"\nschedulers = ["magic"]', "unknown schedulers"),
        ('path = "/m"\ndefault_width = 100', "default_width"),
        ('path = "/m"\nmax_width = 256\nmax_pixels = 65536', "default_width"),  # 512 > 256
        ('path = "/m"\nkinds = ["txt2img", "video"]', "kinds must be some of"),
        ('path = "/m"\nkinds = []', "kinds must be some of"),
        ('path = "/m"\nmax_steps = 1000', "max_steps must be at most 999"),
        ('path = "/m"\ncheckpoint_seconds = -1', "checkpoint_seconds must be 0 or more"),
        ('path = "/m"\ncheckpoint_seconds = "often"', "checkpoint_seconds must be 0 or more"),
    ],
)
def test_unsafe_or_broken_entries_are_refused(tmp_path, table, fragment):
    with pytest.raises(CatalogError, match=fragment):
        _catalog(tmp_path, f"[models.m]\n{table}\n")


def test_a_default_model_that_is_not_defined_is_refused(tmp_path):
    with pytest.raises(CatalogError, match="default_model"):
        _catalog(tmp_path, 'default_model = "x"\n[models.m]\npath = "/m"\n')


def test_an_add_on_family_fits_its_model_family_and_says_whether_loras_apply(tmp_path):
    """A FLUX model takes FLUX ControlNets and LoRAs (its add-on family `flux` or
    `tiny-flux`), an SD model its family's (app/families.py ADDON_FAMILIES); a model
    without an add-on family takes none."""
    catalog = _catalog(
        tmp_path,
        '[models.f]\npath = "/f"\nfamily = "flux"\nlora_family = "flux"\n'
        '[models.s]\npath = "/s"\nlora_family = "sdxl"\nmax_controls = 3\n'
        '[models.plain]\npath = "/p"\n'
        '[controlnets.f-canny]\npath = "/fc"\nfamily = "flux"\n',
    )
    flux, sdxl, plain = (catalog.models[n] for n in ("f", "s", "plain"))
    assert (flux.lora_limit, flux.control_limit) == (flux.max_loras, flux.max_controls) != (0, 0)
    assert (sdxl.lora_limit, sdxl.control_limit) == (sdxl.max_loras, 3) != (0, 3)
    assert (plain.lora_limit, plain.control_limit) == (0, 0)
    assert catalog.controlnets["f-canny"].family == "flux"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[models.f]\npath = "/f"\nfamily = "flux"\nlora_family = "sdxl"\n', "takes flux, tiny"),
        ('[models.s]\npath = "/s"\nlora_family = "flux"\n', "is for flux models"),
        ('[models.s]\npath = "/s"\nlora_family = "sd9"\n', "lora_family must be one of"),
        (
            '[models.s]\npath = "/s"\n[adapters.a]\npath = "/a.st"\nfamily = "sd9"\n',
            r"family \(one of \['flux', 'sd15', 'sd2', 'sdxl', 'tiny', 'tiny-flux'\]\)",
        ),
    ],
)
def test_an_add_on_family_of_another_model_family_is_refused(tmp_path, text, fragment):
    with pytest.raises(CatalogError, match=fragment):
        _catalog(tmp_path, text)


def test_the_add_on_families_with_loras_are_those_whose_widths_the_upload_check_knows():
    from app.addons.lora.checks import FAMILIES as LORA_WIDTHS
    from app.families import ADDON_FAMILIES, FAMILIES

    assert {n for n, a in ADDON_FAMILIES.items() if a.loras} == set(LORA_WIDTHS)
    for addon in ADDON_FAMILIES.values():  # each add-on family's models take ControlNets
        assert FAMILIES[addon.model_family].controlnet_class, addon
