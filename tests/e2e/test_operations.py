"""Operators' tools on real processes: metrics after a known sequence of jobs, the
dead-letter commands on the celery CLI and diffq, Flower with and without credentials,
JSON logs.

The module runs its own RabbitMQ node (with the management plugin, for Flower's broker
tab), an API, a worker that reaches S3 through a proxy the test can cut (to make jobs
fail for real), and Flower; it shares the session's database and S3 server.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid

import pytest
import requests

from testbed.faultproxy import FaultProxy
from testbed.jobs import auth, submit, wait_terminal
from testbed.ports import free_port, wait_for_port
from testbed.private_rabbit import PrivateRabbitMQ
from testbed.processes import ApiServer, ManagedProcess, start_worker
from testbed.waiting import wait_until

pytestmark = pytest.mark.services

FLOWER_AUTH = ("ops", "correct-horse")


class Ops:
    def __init__(self, env, api, worker, flower, proxy, metrics_port, flower_port):
        self.env, self.api, self.worker, self.flower = env, api, worker, flower
        self.proxy = proxy
        self.worker_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        self.flower_url = f"http://127.0.0.1:{flower_port}"

    def celery(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
        return self._run(["celery", "-A", "tasks", *args], input)

    def diffq(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
        """The same operators' commands under `diffq` (cli/operators.py)."""
        return self._run(["cli", *args], input)

    def _run(self, command: list[str], input: str | None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", *command],
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture(scope="module")
def ops(stack, tmp_path_factory):
    from app.broker.topology import declare_topology
    from testbed.services import broker_connection
    from testbed.stack import QUEUES

    workdir = tmp_path_factory.mktemp("ops")
    rabbit = PrivateRabbitMQ(workdir / "rabbit", management=True)
    rabbit.start()
    with broker_connection(rabbit.url) as conn:
        declare_topology(conn, QUEUES)
    proxy = FaultProxy(stack.s3.port).start()
    metrics_port, flower_port = free_port(), free_port()
    env = {
        **stack.env,
        "DIFFQ_BROKER_URL": rabbit.url,
        "DIFFQ_METRICS_DIR": str(workdir / "metrics"),
        "DIFFQ_WORKER_METRICS_PORT": str(metrics_port),
        "DIFFQ_LOG_FORMAT": "json",
        "DIFFQ_UPLOAD_RETRIES": "1",
        "DIFFQ_FLOWER_AUTH": ":".join(FLOWER_AUTH),
        "DIFFQ_RABBITMQ_API_URL": rabbit.management_url,
    }
    api = ApiServer(env, stack.logs, name="api-ops").start()
    worker_env = {**env, "DIFFQ_S3_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}
    worker = start_worker(worker_env, stack.logs, "worker-ops", models="tiny")
    flower = ManagedProcess(
        "flower",
        [sys.executable, "-m", "cli", "flower", "--bind", f"127.0.0.1:{flower_port}"],
        env,
        stack.logs,
    ).start()
    wait_for_port(flower_port, timeout=60)
    yield Ops(env, api, worker, flower, proxy, metrics_port, flower_port)
    flower.stop()
    worker.stop()
    api.stop()
    proxy.stop()
    rabbit.close()


def _samples(url: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(url, timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples, name: str, **labels) -> float:
    """The sum over the samples of `name` whose labels include `labels`."""
    return sum(
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and labels.items() <= dict(sample_labels).items()
    )


def _dead_lettered(ops: Ops, key: str, count: int) -> list[str]:
    """Submit `count` jobs while S3 is unreachable: each fails storage_unavailable and is
    rejected to the DLQ by the worker."""
    ops.proxy.down()
    try:
        ids = [submit(ops.api.url, key, prompt=f"ops-dlq-{i}")["id"] for i in range(count)]
        for job_id in ids:
            body = wait_terminal(ops.api.url, key, job_id, timeout=60)
            assert body["error"]["code"] == "storage_unavailable", body
    finally:
        ops.proxy.up()
    return ids


def test_metrics_count_exactly_what_happened(ops, tenant_key):
    api_before = _samples(ops.api.metrics_url)
    worker_before = _samples(ops.worker_metrics)
    # Every outcome the worker can count is exported from 0, before it happens once, so
    # that rate() sees its first increase.
    never = {"model": "tiny", "status": "failed", "error_code": "gpu_oom"}
    key = ("diffq_jobs_finished_total", tuple(sorted(never.items())))
    assert worker_before.get(key) == 0
    ok = [submit(ops.api.url, tenant_key, prompt=f"ops-ok-{i}", steps=3)["id"] for i in range(5)]
    # One prompt twice (two seeds): the second's encoding comes from the conditioning cache.
    ok += [
        submit(ops.api.url, tenant_key, prompt="ops-same", steps=3, seed=seed)["id"]
        for seed in (1, 2)
    ]
    for job_id in ok:
        assert wait_terminal(ops.api.url, tenant_key, job_id)["status"] == "succeeded"
    failed = _dead_lettered(ops, tenant_key, 2)

    api_after = _samples(ops.api.metrics_url)
    worker_after = _samples(ops.worker_metrics)

    def delta(before, after, name, **labels):
        return _value(after, name, **labels) - _value(before, name, **labels)

    finished = "diffq_jobs_finished_total"
    assert delta(worker_before, worker_after, finished, model="tiny", status="succeeded") == len(ok)
    assert (
        delta(
            worker_before,
            worker_after,
            finished,
            model="tiny",
            status="failed",
            error_code="storage_unavailable",
        )
        == 2
    )
    assert delta(worker_before, worker_after, finished, status="failed") == 2
    generations = "diffq_generation_duration_seconds_count"
    assert delta(worker_before, worker_after, generations, model="tiny", steps="3") == len(ok)
    assert delta(worker_before, worker_after, "diffq_step_duration_seconds_count") == len(ok)
    hits = "diffq_conditioning_cache_hits_total"
    assert delta(worker_before, worker_after, hits, model="tiny") == 1
    misses = "diffq_conditioning_cache_misses_total"
    assert delta(worker_before, worker_after, misses, model="tiny") == len(ok) - 1 + len(failed)
    saved = "diffq_conditioning_cache_saved_seconds_total"
    assert delta(worker_before, worker_after, saved, model="tiny") > 0
    assert delta(worker_before, worker_after, "diffq_worker_busy_seconds_total") > 0
    submitted = len(ok) + len(failed)
    assert delta(api_before, api_after, "diffq_jobs_submitted_total", model="tiny") == submitted
    posts = dict(route="/v1/jobs", method="POST", status="202")
    assert delta(api_before, api_after, "diffq_http_requests_total", **posts) == submitted
    latency = dict(route="/v1/jobs", method="POST")
    durations = "diffq_http_request_duration_seconds_count"
    assert delta(api_before, api_after, durations, **latency) == submitted
    # Read from RabbitMQ at scrape time (cached 5 s): the two failures wait in the DLQ.
    api_after = wait_until(
        lambda: (
            (s := _samples(ops.api.metrics_url))
            and _value(s, "diffq_dlq_depth", queue="gpu.tiny") == 2
            and s
        ),
        timeout=15,
        interval=0.5,
    )
    assert _value(api_after, "diffq_queue_consumers", queue="gpu.tiny") == 1
    assert _value(api_after, "diffq_broker_up") == 1
    print(f"\nmetrics: 5 succeeded + 2 failed -> counters {5}/{2}; dead letters {failed}")
    _purge_all(ops)  # leave the DLQ empty for the next test


def _purge_all(ops: Ops) -> None:
    result = ops.celery("dlq", "purge", "--all", "--yes")
    assert result.returncode == 0, result.stderr


def test_dead_letters_listed_requeued_and_purged_with_celery_and_diffq(ops, tenant_key, db):
    from app.db.models.jobs import Job

    first, second = _dead_lettered(ops, tenant_key, 2)

    listed = ops.celery("dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    letters = {row["job_id"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert set(letters) == {first, second}
    assert letters[first]["death_reason"] == "rejected"
    assert letters[first]["error"].startswith("storage_unavailable")
    assert letters[first]["attempts"] == 1
    assert letters[first]["age_seconds"] >= 0
    # Listing took nothing away (and `diffq dlq` is the same command).
    again = ops.diffq("dlq", "list", "--json")
    assert len(again.stdout.splitlines()) == 2

    # A destructive command asks first; "no" changes nothing.
    refused = ops.diffq("dlq", "purge", "--all", input="n\n")
    assert refused.returncode != 0 and "Aborted" in refused.stderr
    assert len(ops.celery("dlq", "list", "--json").stdout.splitlines()) == 2

    requeued = ops.celery("dlq", "requeue", "--job", first, "--yes")
    assert requeued.returncode == 0, requeued.stderr
    assert f"{first}  gpu.tiny" in requeued.stdout and "requeued 1 of 1" in requeued.stdout
    assert wait_terminal(ops.api.url, tenant_key, first)["status"] == "succeeded"

    purged = ops.celery("dlq", "purge", "--all", "--yes")
    assert purged.returncode == 0 and "purged 1 of 1" in purged.stdout
    assert ops.celery("dlq", "list", "--json").stdout.strip() == ""
    with db.session() as session:
        row = session.get(Job, uuid.UUID(second))
        assert (row.status.value, row.error_code) == ("failed", "storage_unavailable")
        assert row.attempts == 1

    # A failed job by id: back to queued with a fresh budget, and it runs.
    by_id = ops.diffq("requeue", second, "--yes")
    assert by_id.returncode == 0 and "requeued 1 of 1" in by_id.stdout, by_id.stdout
    assert wait_terminal(ops.api.url, tenant_key, second)["status"] == "succeeded"
    # Succeeded jobs are left alone; `celery jobs requeue` is the older spelling.
    for again in (
        ops.celery("requeue", second, "--yes"),
        ops.celery("jobs", "requeue", second, "--yes"),
    ):
        assert again.returncode == 0 and "skipped: job succeeded" in again.stdout, again.stderr
    print("\ndlq: 2 dead-lettered, 1 requeued and succeeded, 1 purged then requeued by id; lost 0")


def test_queue_depths_and_the_standard_celery_commands(ops):
    depths = ops.celery("queues", "--json")
    assert depths.returncode == 0, depths.stderr
    rows = {row["queue"]: row for row in map(json.loads, depths.stdout.splitlines())}
    assert rows["gpu.tiny"]["queue_consumers"] == 1
    assert rows["gpu.tiny"]["dlq_depth"] == 0
    assert rows["gpu.tiny-b"]["queue_consumers"] == 0
    same = ops.diffq("queues", "--json")
    assert same.returncode == 0, same.stderr
    assert {row["queue"] for row in map(json.loads, same.stdout.splitlines())} == set(rows)

    status = ops.celery("status")
    assert status.returncode == 0 and "worker-ops@" in status.stdout, status.stdout
    active = ops.celery("inspect", "active", "--json")
    assert active.returncode == 0, active.stderr
    assert any(name.startswith("worker-ops@") for name in json.loads(active.stdout))
    purge = ops.celery("purge", "-f", "-Q", "gpu.tiny-b")
    assert purge.returncode == 0 and "No messages purged" in purge.stdout, purge.stdout


def test_flower_requires_credentials_and_shows_job_ids_not_prompts(ops, tenant_key):
    prompt = f"a secret prompt {uuid.uuid4().hex}"
    job_id = submit(ops.api.url, tenant_key, prompt=prompt, steps=2)["id"]
    wait_terminal(ops.api.url, tenant_key, job_id)

    assert requests.get(f"{ops.flower_url}/api/workers", timeout=10).status_code == 401
    wrong = requests.get(f"{ops.flower_url}/api/workers", auth=("ops", "nope"), timeout=10)
    assert wrong.status_code == 401
    workers = requests.get(f"{ops.flower_url}/api/workers", auth=FLOWER_AUTH, timeout=30)
    assert workers.status_code == 200
    assert any(name.startswith("worker-ops@") for name in workers.json())

    def task_seen():
        response = requests.get(f"{ops.flower_url}/api/tasks", auth=FLOWER_AUTH, timeout=10)
        return response if job_id in response.text else None

    tasks = wait_until(task_seen, timeout=30, interval=0.5)
    task = tasks.json()[job_id]
    assert task["name"] == "diffq.generate"
    assert task["args"] == f"job_id={job_id}"
    assert prompt not in tasks.text

    broker = requests.get(f"{ops.flower_url}/broker", auth=FLOWER_AUTH, timeout=30)
    assert broker.status_code == 200
    # Queue rows come from RabbitMQ's management API (without it, Flower lists none).
    assert "gpu.tiny" in broker.text
    assert "Unable to get queues" not in ops.flower.log()


def test_flower_counts_job_outcomes_not_message_outcomes(ops, tenant_key):
    """An operator reading Flower sees what happened to the jobs: a job that succeeded is
    a succeeded task, a failed job a failed task, and the message of a job canceled
    before it ran, which the worker discards, is not a success (revoked)."""
    done = submit(ops.api.url, tenant_key, prompt="flower ok", steps=2, seed=1)["id"]
    assert wait_terminal(ops.api.url, tenant_key, done)["status"] == "succeeded"
    [failed] = _dead_lettered(ops, tenant_key, 1)
    # A job canceled while it waits behind a long one: its message is discarded unrun.
    body = {"prompt": "flower long", "width": 256, "height": 192, "steps": 60, "seed": 2}
    long = submit(ops.api.url, tenant_key, **body)["id"]
    canceled = submit(ops.api.url, tenant_key, prompt="flower canceled", steps=2, seed=3)["id"]
    answer = requests.post(
        f"{ops.api.url}/v1/jobs/{canceled}/cancel", headers=auth(tenant_key), timeout=10
    )
    assert answer.status_code == 200, answer.text
    wait_terminal(ops.api.url, tenant_key, long, timeout=120)
    ops.worker.wait_for_log(rf"job {canceled} not run: finished", timeout=60)
    wanted = {done: "SUCCESS", failed: "FAILURE", canceled: "REVOKED"}

    def states():
        tasks = requests.get(f"{ops.flower_url}/api/tasks", auth=FLOWER_AUTH, timeout=10).json()
        seen = {job_id: (tasks.get(job_id) or {}).get("state") for job_id in wanted}
        return seen if seen == wanted else None

    try:
        wait_until(states, timeout=30, interval=0.5)
    finally:
        tasks = requests.get(f"{ops.flower_url}/api/tasks", auth=FLOWER_AUTH, timeout=10).json()
        print({job_id: (tasks.get(job_id) or {}).get("state") for job_id in wanted})


def test_worker_json_logs_carry_the_job_on_every_line_about_it(ops, tenant_key):
    job_id = submit(ops.api.url, tenant_key, prompt="ops-logs", steps=2)["id"]
    wait_terminal(ops.api.url, tenant_key, job_id)
    wait_until(lambda: "succeeded in" in ops.worker.log(), timeout=10)
    about = []
    for line in ops.worker.log().splitlines():
        if job_id in line and line.startswith("{"):
            about.append(json.loads(line))
    assert len(about) >= 4, about  # received, claimed, succeeded, task succeeded
    assert all(record["job_id"] == job_id for record in about), about
    ours = [r for r in about if r["logger"].startswith("workers.")]
    assert ours and all(r["tenant"] and r["attempt"] == "1" for r in ours), ours
    plain = [line for line in ops.worker.log().splitlines() if re.search(job_id, line)]
    assert all(line.startswith("{") for line in plain), plain


def _used_metrics() -> dict[str, set[str]]:
    """Every diffq_* name in the dashboard's and the alert rules' expressions."""
    from pathlib import Path

    import yaml

    deploy = Path(__file__).resolve().parents[2] / "deploy"
    exprs: dict[str, list[str]] = {"dashboard": [], "alerts": []}

    def walk(node, into):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    into.append(value)
                else:
                    walk(value, into)
        elif isinstance(node, list):
            for item in node:
                walk(item, into)

    walk(json.loads((deploy / "grafana" / "diffq-dashboard.json").read_text()), exprs["dashboard"])
    walk(yaml.safe_load((deploy / "prometheus" / "alerts.yaml").read_text()), exprs["alerts"])
    return {
        source: {name for expr in found for name in re.findall(r"\bdiffq_[a-z0-9_]+", expr)}
        for source, found in exprs.items()
    }


class _FakeNvml:
    """Stands in for the NVIDIA driver, which these machines do not have."""

    class _Memory:
        used, total = 3 * 2**30, 80 * 2**30

    class _Rates:
        gpu = 42

    nvmlInit = staticmethod(lambda: None)
    nvmlDeviceGetHandleByIndex = staticmethod(lambda index: index)
    nvmlDeviceGetMemoryInfo = staticmethod(lambda handle: _FakeNvml._Memory())
    nvmlDeviceGetUtilizationRates = staticmethod(lambda handle: _FakeNvml._Rates())


def test_every_metric_a_dashboard_or_alert_uses_is_exported(ops, tenant_key, monkeypatch):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from app.metrics.gpu import GpuCollector

    # Exported by the running API and worker, after they have served a job.
    job_id = submit(ops.api.url, tenant_key, prompt="ops-export", steps=2)["id"]
    wait_terminal(ops.api.url, tenant_key, job_id)
    exported = {name for name, _labels in _samples(ops.api.metrics_url)}
    exported |= {name for name, _labels in _samples(ops.worker_metrics)}
    # GPU gauges: the worker's collector, reading a stand-in for NVML.
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml)
    registry = CollectorRegistry()
    registry.register(GpuCollector([0]))
    gpu_text = generate_latest(registry).decode()
    gpu = {s.name for f in text_string_to_metric_families(gpu_text) for s in f.samples}
    assert 'diffq_gpu_utilization_ratio{gpu="0"} 0.42' in gpu_text
    exported |= gpu
    used = _used_metrics()
    assert used["dashboard"] and used["alerts"]
    # The webhook worker's (not running here): tests/e2e/test_monitoring.py scrapes it and
    # fires the alert that reads them.
    hooks = {name for name in used["alerts"] if name.startswith("diffq_webhook_")}
    assert hooks == {"diffq_webhook_deliveries_total"}, hooks
    # The relay's, likewise: test_monitoring.py scrapes a relay and fires DiffqRelayStalled.
    relay = {name for name in used["alerts"] if name.startswith("diffq_relay_")}
    assert relay == {"diffq_relay_passes_total"}, relay
    for source, names in used.items():
        missing = sorted(names - exported - hooks - relay)
        assert not missing, f"the {source} uses metrics nobody exports: {missing}"
    print(f"\n{len(used['dashboard'] | used['alerts'])} metrics used, all exported")
