"""Quantized weights through the whole path (the catalog's `quantize`, workers/quantized.py),
on PostgreSQL, RabbitMQ and S3 and on `diffq up`'s embedded stores: a catalog serves the
tiny model twice, as it is and with `quantize = "int8"`. `GET /v1/models` says which is
quantized; the same request on each succeeds, the manifests say `int8` and nothing, their
model digests differ (so a quantized result never answers for the other from the result
cache), and the images differ. A worker asked to serve `fp8` on a CPU does not start: its
log names the model and the reason, and it exits before it takes a job."""

from __future__ import annotations

import pytest
import requests

from testbed.embedded import EmbeddedService
from testbed.jobs import auth, submit, wait_terminal
from testbed.processes import ApiServer, start_worker

pytestmark = pytest.mark.services

QUEUE = "gpu.quantized"
MODEL = """
[models.{name}]
path = "{path}"
queue = "{queue}"
dtype = "float32"
default_width = 64
default_height = 64
max_width = 128
max_height = 128
default_steps = 2
soft_time_limit = 120
time_limit = 180
{extra}
"""
BODY = {"prompt": "a lighthouse in fog", "width": 64, "height": 64, "steps": 3, "seed": 21}


def _models(path, queue: str = QUEUE) -> str:
    return MODEL.format(name="tiny-q", path=path, queue=queue, extra="") + MODEL.format(
        name="tiny-int8", path=path, queue=queue, extra='quantize = "int8"'
    )


def _compare(url: str, key: str, mode: str) -> None:
    models = requests.get(f"{url}/v1/models", headers=auth(key), timeout=10).json()["data"]
    shown = {m["name"]: m["quantize"] for m in models if m["name"] in ("tiny-q", "tiny-int8")}
    assert shown == {"tiny-q": None, "tiny-int8": "int8"}, shown
    full = submit(url, key, **BODY, model="tiny-q")
    int8 = submit(url, key, **BODY, model="tiny-int8")
    full, int8 = (wait_terminal(url, key, job["id"], timeout=180) for job in (full, int8))
    assert full["status"] == int8["status"] == "succeeded", (full, int8)
    ran = full["result"]["manifest"], int8["result"]["manifest"]
    assert ran[0]["quantize"] is None and ran[1]["quantize"] == "int8"
    assert ran[0]["weights_sha256"] == ran[1]["weights_sha256"]  # the same files
    assert ran[0]["model_sha256"] != ran[1]["model_sha256"]  # another cache key
    pictures = [
        requests.get(job["result"]["images"][0]["url"], timeout=10).content for job in (full, int8)
    ]
    assert pictures[0] != pictures[1]
    print(f"{mode}: the same request on tiny-q and tiny-int8: both succeeded, images differ")


@pytest.fixture(scope="module")
def pool(stack, tmp_path_factory):
    """An API and a worker on a catalog with the two models on a queue of their own."""
    workdir = tmp_path_factory.mktemp("quantized")
    models = workdir / "models.toml"
    models.write_text(_models(stack.tiny_model))
    env = {**stack.env, "DIFFQ_MODELS_FILE": str(models)}
    api = ApiServer(env, stack.logs, name="api-quantized").start()
    worker = None
    try:
        worker = start_worker(env, stack.logs, "worker-quantized", "tiny-q,tiny-int8")
        yield api, env
    finally:
        if worker is not None:
            worker.stop()
        api.stop()


def test_a_quantized_model_runs_through_the_whole_path(pool, tenant_key):
    api, _ = pool
    _compare(api.url, tenant_key, "production")


def test_a_quantized_model_runs_on_the_embedded_stores(tmp_path):
    from workers.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "tiny")
    models = tmp_path / "models.toml"
    models.write_text(_models(path, queue="gpu.tiny"))
    service = EmbeddedService(tmp_path / "home", DIFFQ_MODELS_FILE=str(models)).start()
    try:
        _compare(service.url, service.new_key(), "embedded")
    finally:
        service.stop()


def test_a_worker_asked_for_fp8_on_a_cpu_does_not_start(stack, tmp_path):
    models = tmp_path / "models.toml"
    models.write_text(
        MODEL.format(
            name="tiny-fp8", path=stack.tiny_model, queue="gpu.fp8", extra='quantize = "fp8"'
        )
    )
    env = {**stack.env, "DIFFQ_MODELS_FILE": str(models)}
    worker = start_worker(env, stack.logs, "worker-fp8", "tiny-fp8", wait=False)
    try:
        worker.wait_for_log(r"model 'tiny-fp8': quantize = \"fp8\" needs a CUDA GPU")
        assert worker.process.wait(timeout=120) != 0
        assert worker.count(r"it cannot start \(model load failed: model 'tiny-fp8'") == 1
    finally:
        worker.stop()
