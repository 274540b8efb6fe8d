"""LoRA adapters on a compiled model through the whole path: the API, RabbitMQ, a real
worker whose model has a compile tier (dynamo's capture with `aot_eager`: inductor's code
generation takes minutes on a CPU), adapters uploaded through `/v1/adapters`, the images
in S3. Once the model's two adapter slots exist, new adapters and scales are hot-swapped
into them: the worker's `diffq_worker_compiled_graphs_total` does not move, and each
adapter set makes its own image."""

from __future__ import annotations

import pytest
import requests

from app.broker.topology import declare_topology
from testbed.jobs import auth, submit, wait_terminal
from testbed.ports import free_port
from testbed.processes import ApiServer, start_worker
from testbed.services import broker_connection
from testbed.stack import MODELS_TOML
from workers.tiny import build_tiny_lora

pytestmark = pytest.mark.services

COMPILED_TABLE = """
[models.tiny-compiled]
path = "{tiny}"
dtype = "float32"
max_width = 128
max_height = 128
max_pixels = 16384
default_width = 64
default_height = 64
default_steps = 2
soft_time_limit = 60
time_limit = 90
lora_family = "tiny"
max_loras = 2
lora_rank = 8
compile_sizes = ["64x64"]
compile_backend = "aot_eager"
"""


@pytest.fixture(scope="module")
def compiled(stack, tmp_path_factory):
    """The session's catalog plus `tiny-compiled`, an API reading it and a worker serving
    it with its own metrics port."""
    root = tmp_path_factory.mktemp("compiled")
    models_file = root / "models.toml"
    models_file.write_text(
        MODELS_TOML.format(
            tiny=stack.tiny_model,
            adapter=stack.tiny_model.parent / "ink.safetensors",
            tiny_video=stack.tiny_model.parent / "tiny-video",
            controlnet=stack.tiny_model.parent / "tiny-controlnet",
        )
        + COMPILED_TABLE.format(tiny=stack.tiny_model)
    )
    port = free_port()
    env = {
        **stack.env,
        "DIFFQ_MODELS_FILE": str(models_file),
        "DIFFQ_WORKER_METRICS_PORT": str(port),
        "DIFFQ_METRICS_DIR": str(root / "metrics"),
        "DIFFQ_COMPILE_CACHE": str(root / "compile-cache"),
    }
    with broker_connection(stack.broker_url) as conn:
        declare_topology(conn, ["gpu.tiny-compiled"])
    api = ApiServer(env, stack.logs, name="api-compiled").start()
    worker = start_worker(env, stack.logs, "worker-compiled", models="tiny-compiled")
    api.worker_metrics = f"http://127.0.0.1:{port}/metrics"
    yield api
    worker.stop()
    api.stop()


def _graphs(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(url, timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "diffq_worker_compiled_graphs_total"
        and sample.labels.get("model") == "tiny-compiled"
    )


def test_adapters_swap_into_a_compiled_model_without_recompiling(compiled, tenant_key):
    ids = []
    for seed in (11, 12, 13, 14):
        answer = requests.post(
            f"{compiled.url}/v1/adapters",
            files={"file": (f"style-{seed}.safetensors", build_tiny_lora(seed))},
            data={"model": "tiny-compiled"},
            headers=auth(tenant_key),
            timeout=30,
        )
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    a, b, c, d = ids
    body = {"model": "tiny-compiled", "prompt": "a kite", "seed": 4, "steps": 2}

    def run(*loras: tuple[str, float]) -> bytes:
        sent = [{"id": adapter, "scale": scale} for adapter, scale in loras]
        job = submit(compiled.url, tenant_key, **body, loras=sent, cache=False)
        done = wait_terminal(compiled.url, tenant_key, job["id"], timeout=120)
        assert done["status"] == "succeeded", done
        return requests.get(done["result"]["images"][0]["url"], timeout=10).content

    started = _graphs(compiled.worker_metrics)
    assert started > 0  # the compile tier, traced at the warm-up
    run((a, 1.0))
    run((a, 0.5), (b, 1.0))  # the two slots made
    before = _graphs(compiled.worker_metrics)
    images = [run((c, 1.0)), run((d, 0.7)), run((a, 1.0), (c, 0.3)), run((b, 0.9))]
    after = _graphs(compiled.worker_metrics)
    print(
        f"graphs: {started:.0f} at the warm-up, {before - started:.0f} making the slots, "
        f"{after - before:.0f} across {len(images)} swaps"
    )
    assert after == before
    assert len(set(images)) == len(images)
