"""SD3 and FLUX jobs through the whole path: the API, RabbitMQ, a real worker process
loading tiny random-weight SD3 and FLUX pipelines (workers/tiny_flow.py) from their
directories, the outcome in PostgreSQL and the image in S3. A scheduler of another family
is refused at submit, a 422 naming `scheduler`; a few-step preset's defaults run. A FLUX
ControlNet steers a FLUX job of every image kind, and a FLUX LoRA uploaded for the FLUX
model changes its image; an SD ControlNet or an SD LoRA on the FLUX model, and the FLUX
ControlNet or a FLUX LoRA on an SD model, are a 422 naming the field."""

from __future__ import annotations

import base64
import io

import pytest
import requests
from PIL import Image

from app.broker.topology import declare_topology
from testbed.jobs import auth, submit, wait_terminal
from testbed.processes import ApiServer, start_worker
from testbed.services import broker_connection
from testbed.stack import MODELS_TOML, build_tiny_flux_controlnet, build_tiny_model

pytestmark = pytest.mark.services

FAMILY_TABLES = """
[models.tiny-sd3]
path = "{sd3}"
family = "sd3"
dtype = "float32"
max_width = 128
max_height = 128
max_pixels = 16384
default_width = 64
default_height = 64
default_steps = 3
soft_time_limit = 60
time_limit = 90

[models.tiny-flux]
path = "{flux}"
family = "flux"
preset = "schnell"
dtype = "float32"
max_width = 128
max_height = 128
max_pixels = 16384
default_width = 64
default_height = 64
soft_time_limit = 60
time_limit = 90
lora_family = "tiny-flux"

[controlnets.tiny-flux-canny]
path = "{flux_canny}"
family = "tiny-flux"
"""


@pytest.fixture(scope="module")
def families(stack, tmp_path_factory):
    """The session's catalog plus a tiny SD3 and a tiny FLUX model, an API reading it and
    a worker serving the two."""
    root = tmp_path_factory.mktemp("families")
    # `diffq model build-tiny --family …`, once a run (testbed/stack.py's model cache)
    paths = {family: build_tiny_model(root / family, family) for family in ("sd3", "flux")}
    paths["flux_canny"] = build_tiny_flux_controlnet(root / "flux-canny")
    models_file = root / "models.toml"
    models_file.write_text(
        MODELS_TOML.format(
            tiny=stack.tiny_model,
            adapter=stack.tiny_model.parent / "ink.safetensors",
            tiny_video=stack.tiny_model.parent / "tiny-video",
            controlnet=stack.tiny_model.parent / "tiny-controlnet",
        )
        + FAMILY_TABLES.format(**paths)
    )
    env = {**stack.env, "DIFFQ_MODELS_FILE": str(models_file)}
    with broker_connection(stack.broker_url) as conn:
        declare_topology(conn, ["gpu.tiny-sd3", "gpu.tiny-flux"])
    api = ApiServer(env, stack.logs, name="api-families").start()
    worker = start_worker(env, stack.logs, "worker-families", models="tiny-sd3,tiny-flux")
    yield api
    worker.stop()
    api.stop()


@pytest.mark.parametrize(
    ("model", "scheduler", "steps"),
    [("tiny-sd3", "flow_heun", 3), ("tiny-sd3", "default", 3), ("tiny-flux", "flow_euler", 4)],
)
def test_a_flow_family_job_runs_through_the_whole_path(
    families, tenant_key, model, scheduler, steps
):
    body = {"model": model, "prompt": "a lighthouse", "scheduler": scheduler, "seed": 11}
    if model == "tiny-flux":
        body["width"] = 128  # a multiple of the family's 16
    else:
        body["num_images"] = 2
    job = submit(families.url, tenant_key, **body)
    # tiny-sd3 runs at its own default_steps, tiny-flux at its preset's (schnell: 4).
    assert job["input"]["steps"] == steps
    done = wait_terminal(families.url, tenant_key, job["id"], timeout=120)
    assert done["status"] == "succeeded", done
    images = done["result"]["images"]
    assert len(images) == body.get("num_images", 1)
    assert (images[0]["width"], images[0]["height"]) == (body.get("width", 64), 64)
    assert done["progress"]["step"] == done["progress"]["total_steps"] == steps
    response = requests.get(images[0]["url"], timeout=10)
    assert response.status_code == 200 and response.content.startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("model", "body", "field"),
    [
        ("tiny-sd3", {"scheduler": "ddim"}, "scheduler"),
        ("tiny-flux", {"scheduler": "flow_heun"}, "scheduler"),
        ("tiny", {"scheduler": "flow_euler"}, "scheduler"),
        ("tiny-flux", {"width": 72}, "width"),
        ("tiny-flux", {"steps": 9}, "steps"),  # the schnell preset's ceiling is 8
    ],
)
def test_what_a_family_cannot_run_is_a_422_naming_the_field(
    families, tenant_key, model, body, field
):
    response = requests.post(
        f"{families.url}/v1/jobs",
        json={"model": model, "prompt": "a lighthouse", **body},
        headers=auth(tenant_key),
        timeout=10,
    )
    assert response.status_code == 422, response.text
    assert list(response.json()["errors"]["json"]) == [field]


def test_the_models_endpoint_shows_each_family_its_schedulers(families, tenant_key):
    response = requests.get(f"{families.url}/v1/models", headers=auth(tenant_key), timeout=10)
    models = {m["name"]: m for m in response.json()["data"]}
    assert models["tiny-sd3"]["schedulers"] == ["default", "flow_euler", "flow_heun"]
    assert models["tiny-flux"]["schedulers"] == ["default", "flow_euler"]
    assert "flow_euler" not in models["tiny"]["schedulers"]
    assert models["tiny-flux"]["family"] == "flux"
    assert models["tiny-flux"]["preset"] == "schnell"


def _data_uri(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _square(box=(16, 16, 48, 48)) -> Image.Image:
    image = Image.new("RGB", (64, 64), (20, 20, 20))
    image.paste((230, 120, 40), box)
    return image


def _pixels(url: str) -> bytes:
    response = requests.get(url, timeout=10)
    assert response.status_code == 200
    return Image.open(io.BytesIO(response.content)).tobytes()


@pytest.mark.parametrize("kind", ["txt2img", "img2img", "inpaint"])
def test_a_flux_controlnet_steers_a_flux_job_of_every_image_kind(families, tenant_key, kind):
    body = {"model": "tiny-flux", "kind": kind, "prompt": "a lantern", "seed": 5, "cache": False}
    if kind != "txt2img":
        body["image"] = _data_uri(Image.new("RGB", (64, 64), (90, 140, 200)))
    if kind == "inpaint":
        mask = Image.new("L", (64, 64), 0)
        mask.paste(255, (8, 8, 56, 56))
        body["mask"] = _data_uri(mask)
    control = {"controlnet": "tiny-flux-canny", "image": _data_uri(_square()), "end": 0.9}
    plain = submit(families.url, tenant_key, **body)
    steered = submit(families.url, tenant_key, **body, controls=[control])
    plain, steered = (wait_terminal(families.url, tenant_key, j["id"]) for j in (plain, steered))
    assert plain["status"] == steered["status"] == "succeeded", (plain, steered)
    assert steered["result"]["manifest"]["controls"][0]["controlnet"] == "tiny-flux-canny"
    assert _pixels(steered["result"]["images"][0]["url"]) != _pixels(
        plain["result"]["images"][0]["url"]
    )


@pytest.mark.parametrize(
    ("model", "extra", "field"),
    [
        ("tiny-flux", {"controls": [{"controlnet": "tiny-canny"}]}, "controls"),
        ("tiny", {"controls": [{"controlnet": "tiny-flux-canny"}]}, "controls"),
        ("tiny-flux", {"loras": [{"name": "ink"}]}, "loras"),
    ],
)
def test_an_add_on_of_another_family_is_a_422_naming_the_field(
    families, tenant_key, model, extra, field
):
    for control in extra.get("controls", []):
        control["image"] = _data_uri(_square())
    response = requests.post(
        f"{families.url}/v1/jobs",
        json={"model": model, "prompt": "a lighthouse", **extra},
        headers=auth(tenant_key),
        timeout=10,
    )
    assert response.status_code == 422, response.text
    errors = response.json()["errors"]["json"]
    assert list(errors) == [field], errors
    if field == "controls":
        assert "controlnet" in errors["controls"]["0"], errors


def test_the_models_endpoint_offers_a_flux_model_its_controlnets_and_loras(families, tenant_key):
    from app.catalog import ModelSpec

    response = requests.get(f"{families.url}/v1/models", headers=auth(tenant_key), timeout=10)
    models = {m["name"]: m for m in response.json()["data"]}
    flux = models["tiny-flux"]
    most = ModelSpec.__dataclass_fields__["max_loras"].default  # the catalog's default
    assert (flux["lora_family"], flux["max_loras"], flux["shared_adapters"]) == (
        "tiny-flux",
        most,
        [],  # the catalog's shared adapter is an SD one
    )
    assert (flux["controlnets"], flux["max_controls"]) == (["tiny-flux-canny"], 2)
    assert "tiny-flux-canny" not in models["tiny"]["controlnets"]
    assert models["tiny-sd3"]["max_controls"] == 0


def _upload_adapter(url: str, key: str, data: bytes, model: str) -> requests.Response:
    return requests.post(
        f"{url}/v1/adapters",
        files={"file": ("style.safetensors", data)},
        data={"model": model},
        headers=auth(key),
        timeout=30,
    )


def test_a_flux_lora_uploaded_for_the_flux_model_changes_its_image(families, tenant_key):
    from workers.tiny import build_tiny_lora

    flux_lora = build_tiny_lora(5, family="tiny-flux", strength=0.5)
    # Each refused at upload for a model of the other architecture, naming the file.
    for data, model in ((flux_lora, "tiny"), (build_tiny_lora(5), "tiny-flux")):
        refused = _upload_adapter(families.url, tenant_key, data, model)
        assert refused.status_code == 422, refused.text
        assert "file" in refused.json()["errors"]["files"], refused.text
    made = _upload_adapter(families.url, tenant_key, flux_lora, "tiny-flux")
    assert made.status_code == 201, made.text
    assert made.json()["family"] == "tiny-flux"
    body = {"model": "tiny-flux", "prompt": "a lantern", "seed": 7, "cache": False}
    plain = submit(families.url, tenant_key, **body)
    styled = submit(families.url, tenant_key, **body, loras=[{"id": made.json()["id"]}])
    plain, styled = (wait_terminal(families.url, tenant_key, j["id"]) for j in (plain, styled))
    assert plain["status"] == styled["status"] == "succeeded", (plain, styled)
    assert styled["result"]["manifest"]["loras"][0]["sha256"] == made.json()["sha256"]
    assert _pixels(styled["result"]["images"][0]["url"]) != _pixels(
        plain["result"]["images"][0]["url"]
    )
