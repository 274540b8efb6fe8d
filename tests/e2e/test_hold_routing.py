"""The hold on real workers (workers/hold.py): two workers on one queue serving two models
of their own weights, each holding one model at a time (DIFFQ_WORKER_MAX_MODELS=1). While
worker W1 runs a long `hold-x` job, worker W2 (holding `hold-y`) receives the message of
a new `hold-x` job: it waits instead of loading `hold-x`, and the job runs on W1, the
worker that holds its model, once W1 is free. With both idle, every `hold-x` job runs on
W1: a message RabbitMQ gives W2 goes back to the queue, and on to W1. Through the API,
RabbitMQ, PostgreSQL and S3, with the workers' own registry of what they hold."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import requests

from testbed.jobs import auth, submit, wait_terminal
from testbed.processes import ApiServer, start_worker
from testbed.waiting import wait_until

pytestmark = pytest.mark.services

QUEUE = "gpu.hold-routing"
MODEL = """
[models.{name}]
path = "{path}"
queue = "{queue}"
dtype = "float32"
default_width = 64
default_height = 64
max_width = 512
max_height = 512
max_pixels = 262144
max_steps = 999
default_steps = 2
soft_time_limit = 300
time_limit = 330
"""


@pytest.fixture(scope="module")
def pool(stack, tmp_path_factory):
    """An API and two workers on a catalog with `hold-x` and `hold-y` (a copy of the tiny
    model's weights: another pipeline) on a queue of their own."""
    workdir = tmp_path_factory.mktemp("hold")
    other = workdir / "tiny-y"
    shutil.copytree(stack.tiny_model, other)
    models = workdir / "models.toml"
    models.write_text(
        Path(stack.env["DIFFQ_MODELS_FILE"]).read_text()
        + MODEL.format(name="hold-x", path=stack.tiny_model, queue=QUEUE)
        + MODEL.format(name="hold-y", path=other, queue=QUEUE)
    )
    env = {**stack.env, "DIFFQ_MODELS_FILE": str(models), "DIFFQ_WORKER_MAX_MODELS": "1"}
    api = ApiServer(env, stack.logs, name="api-hold").start()
    workers = []
    try:
        for name in ("hold-1", "hold-2"):  # each loads hold-x, the first it serves, at start
            workers.append(start_worker(env, stack.logs, f"worker-{name}", "hold-x,hold-y"))
        yield api, workers
    finally:
        for worker in workers:
            worker.stop()
        api.stop()


def test_a_free_worker_leaves_a_job_to_the_busy_worker_that_holds_its_model(pool, tenant_key):
    api, workers = pool
    url = api.url

    def claimed_by(job_id: str):
        return next((w for w in workers if w.count(rf"job {job_id} claimed") > 0), None)

    # W1 runs a job of hold-x that lasts minutes (999 steps of 512², a tenth of a second
    # each or more) until it is cancelled.
    long = submit(url, tenant_key, model="hold-x", prompt="long", steps=999, width=512, height=512)
    w1 = wait_until(lambda: claimed_by(long["id"]), timeout=60, what="the long job's claim")
    [w2] = [w for w in workers if w is not w1]
    # W2, the only free worker, runs a hold-y job: it unloads hold-x for hold-y.
    other = submit(url, tenant_key, model="hold-y", prompt="y", steps=2)
    assert wait_terminal(url, tenant_key, other["id"], timeout=60)["status"] == "succeeded"
    assert claimed_by(other["id"]) is w2
    loads_before = w2.count(r"model hold-x loaded")
    # Two hold-x jobs: W2 receives the first's message and waits; the second's message
    # stays queued for W1.
    first = submit(url, tenant_key, model="hold-x", prompt="x1", steps=2)
    second = submit(url, tenant_key, model="hold-x", prompt="x2", steps=2)
    w2.wait_for_log(r"waits: its jobs' models are loaded on busy workers", timeout=60)
    assert claimed_by(first["id"]) is None  # still waiting for W1
    status = requests.get(f"{url}/v1/jobs/{long['id']}", headers=auth(tenant_key), timeout=10)
    assert status.json()["status"] == "running", "the long job ended before the hold began"
    cancel = requests.post(
        f"{url}/v1/jobs/{long['id']}/cancel", headers=auth(tenant_key), timeout=10
    )
    assert cancel.status_code == 200, cancel.text
    done = [wait_terminal(url, tenant_key, j["id"], timeout=120) for j in (first, second)]
    assert [j["status"] for j in done] == ["succeeded", "succeeded"]
    # The first ran where its model was loaded, on W1's next message, not on W2's.
    assert claimed_by(first["id"]) is w1, (w1.name, w2.name)
    # The second waited for W1 too; once W1 was idle its message went back, to W1.
    assert claimed_by(second["id"]) is w1
    assert w2.count(r"model hold-x loaded") == loads_before  # W2 never loaded hold-x
    # Both idle now: one job after another, each runs on W1, whichever worker RabbitMQ
    # gives its message to (a message handed back reaches the consumer free the longest).
    handed_before = w2.count(r": to the idle worker that holds its model")
    for n in range(4):
        job = submit(url, tenant_key, model="hold-x", prompt=f"idle{n}", steps=2)
        assert wait_terminal(url, tenant_key, job["id"], timeout=60)["status"] == "succeeded"
        assert claimed_by(job["id"]) is w1, n
    assert w2.count(r"model hold-x loaded") == loads_before
    handed = w2.count(r": to the idle worker that holds its model") - handed_before
    print(f"all hold-x jobs ran on the holder; messages {w2.name} handed back when idle: {handed}")
