"""SD3 and FLUX jobs through the whole path: the API, RabbitMQ, a real worker process
loading tiny random-weight SD3 and FLUX pipelines (workers/tiny_flow.py) from their
directories, the outcome in PostgreSQL and the image in S3. A scheduler of another family
is refused at submit, a 422 naming `scheduler`; a few-step preset's defaults run."""

from __future__ import annotations

import pytest
import requests
from kombu import Connection

from app.broker.topology import declare_topology
from testbed.jobs import auth, submit, wait_terminal
from testbed.processes import ApiServer, start_worker
from testbed.stack import MODELS_TOML, build_tiny_model

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
"""


@pytest.fixture(scope="module")
def families(stack, tmp_path_factory):
    """The session's catalog plus a tiny SD3 and a tiny FLUX model, an API reading it and
    a worker serving the two."""
    root = tmp_path_factory.mktemp("families")
    # `diffq model build-tiny --family …`, once a run (testbed/stack.py's model cache)
    paths = {family: build_tiny_model(root / family, family) for family in ("sd3", "flux")}
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
    with Connection(stack.broker_url) as conn:
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
