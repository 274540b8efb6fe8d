"""The operators' stack, run: a real Prometheus with compose's prometheus.yml and the
shipped alerts.yaml scrapes a running API, GPU worker and webhook worker (a relay runs
beside them); every Grafana panel's query, both KEDA triggers' queries and
prometheus-adapter's query for the API's HPA answer with the figures this test caused;
then real faults fire each alert that can be caused here, Prometheus sends it to a real
Alertmanager running the shipped alertmanager.yml, which delivers it to the receiver of
its severity (an HTTP server of the test), and each is resolved when its fault ends.

Run on a faster clock, and said so: Prometheus scrapes and evaluates every second, and
the rule file is rewritten with every duration in minutes read as seconds (`for: 10m`
holds 10 s, `rate(...[5m])` looks back 5 s; thresholds unchanged: testbed/monitoring.py);
Alertmanager's grouping waits are a second. Where a threshold is a length of time that
cannot be sped up (a job waiting over 600 s), the test makes a queued job that old in the
database. This machine has no GPU: the worker's GPU gauges come from its real collector
reading a stand-in NVML (testbed/nvml/) whose figures the test sets.

The whole stack is private: its own RabbitMQ node (the broker alert stops it), database,
bucket, free loopback ports; every process it starts is stopped at the end.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest
import requests
import yaml

from testbed import services
from testbed.faultproxy import FaultProxy
from testbed.jobs import auth, submit, wait_terminal
from testbed.monitoring import (
    ALERTS_YAML,
    DEPLOY,
    NVML_STANDIN,
    SPEEDUP,
    Alertmanager,
    NvmlStandIn,
    Prometheus,
    binary,
    durations_in_minutes,
    notifications,
    wait_for,
)
from testbed.ports import free_port
from testbed.private_rabbit import PrivateRabbitMQ
from testbed.processes import ApiServer, ManagedProcess
from testbed.receiver import Answer, Receiver
from testbed.services import broker_connection

pytestmark = pytest.mark.services

# The shipped pool names: deploy/k8s/base/keda.yaml scales gpu.sdxl, the spot overlay's
# on-demand pool gpu.sdxl.high. A second model gives the dashboard a second series.
MODELS = """\
default_model = "sdxl"

[models.sdxl]
path = "{tiny}"
queue = "gpu.sdxl"
high_priority_queue = "gpu.sdxl.high"
dtype = "float32"
max_width = 512
max_height = 512
max_pixels = 262144
default_width = 64
default_height = 64
max_steps = 999
default_steps = 2
max_num_images = 4
soft_time_limit = 600
time_limit = 660

[models.tiny]
path = "{tiny}"
queue = "gpu.tiny"
dtype = "float32"
max_width = 128
max_height = 128
max_pixels = 16384
default_width = 64
default_height = 64
max_steps = 50
default_steps = 2
soft_time_limit = 60
time_limit = 90
"""
QUEUES = ["gpu.sdxl", "gpu.sdxl.high", "gpu.tiny"]
GIB = 1 << 30
SCRAPE_APART = 2.5  # seconds: more than a scrape interval (1 s) and its jitter


@dataclass
class Ops:
    env: dict[str, str]
    logs: Path
    rabbit: PrivateRabbitMQ
    s3_proxy: FaultProxy
    database_url: str
    api: ApiServer
    relay: ManagedProcess
    webhooks: ManagedProcess
    worker: ManagedProcess
    worker_env: dict[str, str]
    worker_port: int
    hooks: Receiver  # the jobs' webhook receiver
    alert_sink: Receiver  # where Alertmanager delivers
    nvml: NvmlStandIn
    prometheus: Prometheus
    alertmanager: Alertmanager
    key: str = ""

    def start_worker(self) -> None:
        self.worker = ManagedProcess("worker-mon", self.worker.args, self.worker_env, self.logs)
        self.worker.start()
        self.worker.wait_for_log(r"ready\.", timeout=180)

    def state(self) -> str:
        """What Prometheus and Alertmanager saw, for a failure's message."""
        firing = [(a["labels"]["alertname"], a["state"]) for a in self.prometheus.alerts()]
        delivered = [
            (n["labels"]["alertname"], n["status"]) for n in notifications(self.alert_sink)
        ]
        return (
            f"Prometheus alerts: {firing}\ndelivered: {delivered}\n"
            f"--- prometheus log\n{self.prometheus.log()[-1500:]}\n"
            f"--- alertmanager log\n{self.alertmanager.log()[-1500:]}"
        )


def _standin_driver(folder: Path) -> Path:
    """nvidia-smi as a GPU node's driver answers it: one GPU (torch finds no CUDA here,
    so the worker pinned to it runs on the CPU)."""
    folder.mkdir(parents=True, exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text('#!/bin/sh\nprintf "GPU 0: NVIDIA Stand-in (UUID: GPU-0)\\n"\n')
    smi.chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def ops(stack, tmp_path_factory):
    missing = [
        name
        for name, found in [
            ("prometheus", binary("prometheus")),
            ("alertmanager", binary("prometheus-alertmanager", "alertmanager")),
        ]
        if found is None
    ]
    if missing:
        pytest.skip(
            f"{' and '.join(missing)} not installed: scripts/monitoring installs Debian's "
            "prometheus and prometheus-alertmanager with apt-get as root"
        )
    from app.broker.topology import declare_topology
    from app.db.migrate import upgrade
    from app.db.session import Database
    from app.keys import create_key, get_or_create_tenant

    workdir = tmp_path_factory.mktemp("monitoring")
    logs = workdir / "logs"
    logs.mkdir()
    run = uuid.uuid4().hex[:8]
    with contextlib.ExitStack() as cleanup:  # everything started here is stopped, last first
        rabbit = PrivateRabbitMQ(workdir / "rabbit")
        booting = threading.Thread(target=rabbit.start)
        booting.start()
        cleanup.callback(rabbit.close)
        cleanup.callback(booting.join)
        db_name = f"diffq_monitoring_{run}"
        database_url = services.create_database(db_name)
        cleanup.callback(services.drop_database, db_name)
        upgrade(database_url)
        bucket = f"monitoring-{run}"
        stack.s3.client().create_bucket(Bucket=bucket)
        s3_proxy = FaultProxy(stack.s3.port).start()
        cleanup.callback(s3_proxy.stop)
        (workdir / "models.toml").write_text(MODELS.format(tiny=stack.tiny_model))
        hooks = Receiver().start()
        cleanup.callback(hooks.stop)
        alert_sink = Receiver().start()
        cleanup.callback(alert_sink.stop)
        nvml = NvmlStandIn(workdir / "nvml.json")
        nvml.set(used=2 * GIB, total=8 * GIB, utilization=60)
        booting.join()
        with broker_connection(rabbit.url) as conn:
            declare_topology(conn, QUEUES)
        env = {
            **{k: v for k, v in stack.env.items() if not k.startswith("DIFFQ_")},
            **stack.s3.env(bucket),
            "DIFFQ_HOME": str(workdir / "home"),
            "DIFFQ_DATABASE_URL": database_url,
            "DIFFQ_BROKER_URL": rabbit.url,
            "DIFFQ_MODELS_FILE": str(workdir / "models.toml"),
            "DIFFQ_PROGRESS_INTERVAL": "0.5",
            "DIFFQ_RATE_LIMIT": "0",
            "DIFFQ_UPLOAD_RETRIES": "1",
            "DIFFQ_UPLOAD_BACKOFF": "0.1",
            "DIFFQ_WEBHOOK_ALLOW_CIDRS": "127.0.0.1/32",
            # A retry a second, for a minute: failing deliveries keep failing while the
            # alert's 15 s (15 min) hold runs.
            "DIFFQ_WEBHOOK_SCHEDULE": ",".join(["1"] * 60),
            "DIFFQ_WEBHOOK_TIMEOUT": "2",
            "OMP_NUM_THREADS": "1",
        }
        worker_port, hooks_port, relay_port = free_port(), free_port(), free_port()
        # The worker reaches S3 through a proxy the poison-job scenario cuts.
        worker_env = {
            **env,
            "DIFFQ_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3_proxy.port}",
            "DIFFQ_WORKER_METRICS_PORT": str(worker_port),
            "PATH": f"{_standin_driver(workdir / 'driver')}:{env.get('PATH', '/usr/bin:/bin')}",
            "PYTHONPATH": str(NVML_STANDIN),
            **nvml.env(),
        }
        api = ApiServer(env, logs, name="api-mon", workers=2, threads=8).start()
        cleanup.callback(api.stop)  # the same object when a scenario restarts it
        cli = [sys.executable, "-m", "cli"]
        relay = ManagedProcess(
            "relay-mon",
            [*cli, "relay", "--interval", "0.5", "--metrics-port", str(relay_port)],
            env,
            logs,
        )
        cleanup.callback(relay.start().stop)
        webhooks = ManagedProcess(
            "webhooks-mon",
            [*cli, "webhooks", "--concurrency", "4", "--metrics-port", str(hooks_port)],
            env,
            logs,
        )
        cleanup.callback(webhooks.start().stop)
        # compose's worker command: every GPU nvidia-smi lists.
        worker = ManagedProcess(
            "worker-mon", [*cli, "worker", "--gpus", "all", "--loglevel", "info"], worker_env, logs
        )
        worker.start()
        ops = None
        # A scenario replaces the worker: stop the one running at the end.
        cleanup.callback(lambda: (ops.worker if ops else worker).stop())
        alertmanager = Alertmanager(workdir / "alertmanager", alert_sink.url).start()
        cleanup.callback(alertmanager.stop)
        prometheus = Prometheus(
            workdir / "prometheus",
            {
                "api:9806": f"127.0.0.1:{api.metrics_port}",
                "worker:9808": f"127.0.0.1:{worker_port}",
                "webhooks:9807": f"127.0.0.1:{hooks_port}",
                "relay:9809": f"127.0.0.1:{relay_port}",
                "alertmanager:9093": f"127.0.0.1:{alertmanager.port}",
            },
        ).start()
        cleanup.callback(prometheus.stop)
        worker.wait_for_log(r"ready\.", timeout=180)
        webhooks.wait_for_log(r"ready\.", timeout=120)
        db = Database(database_url, pool_size=1)
        with db.session() as session:
            key = create_key(session, get_or_create_tenant(session, f"mon-{run}"), "monitoring")
        db.dispose()
        ops = Ops(
            env,
            logs,
            rabbit,
            s3_proxy,
            database_url,
            api,
            relay,
            webhooks,
            worker,
            worker_env,
            worker_port,
            hooks,
            alert_sink,
            nvml,
            prometheus,
            alertmanager,
            key,
        )
        yield ops


# --- helpers ----------------------------------------------------------------------------


def _cancel(ops: Ops, job_id: str) -> None:
    response = requests.post(
        f"{ops.api.url}/v1/jobs/{job_id}/cancel", headers=auth(ops.key), timeout=10
    )
    assert response.status_code in (200, 409), response.text


def _job(ops: Ops, job_id: str) -> dict:
    return requests.get(f"{ops.api.url}/v1/jobs/{job_id}", headers=auth(ops.key), timeout=10).json()


def _running(ops: Ops, job_id: str) -> bool:
    job = _job(ops, job_id)
    assert job["status"] in ("queued", "running"), job  # not finished early
    return job["status"] == "running"


def _sql(ops: Ops, statement: str, *args) -> None:
    conn = psycopg2.connect(ops.database_url.replace("postgresql+psycopg2://", "postgresql://"))
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement, args)
    finally:
        conn.close()


def _by(results: list[dict], *labels: str) -> dict:
    return {tuple(r["metric"].get(label, "") for label in labels): r["value"] for r in results}


def _purge_dead_letters(ops: Ops) -> None:
    """The runbook's command for dead letters not worth running again."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "dlq", "purge", "--all", "--yes"],
        env=ops.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def _wait_idle(ops: Ops, timeout: float = 120) -> None:
    """No job queued or running, no dead letter, no alert pending or firing, every queue
    consumed: each scenario starts from a quiet stack."""

    def idle():
        rows = ops.prometheus.query(
            "sum(diffq_queue_depth) + sum(diffq_jobs_in_flight) + sum(diffq_dlq_depth)"
        )
        consumed = ops.prometheus.query("min(diffq_queue_consumers)")
        return (
            rows
            and rows[0]["value"] == 0
            and consumed
            and consumed[0]["value"] == 1
            and not ops.prometheus.alerts()
        )

    wait_for(idle, "the stack idle", timeout, on_timeout=ops.state)


class AlertWatch:
    """One fault: what fires in Prometheus and what Alertmanager delivers, from its start."""

    def __init__(self, ops: Ops, expected: dict[str, dict[str, str]]) -> None:
        self.ops = ops
        self.expected = expected  # alertname -> labels the alert must carry
        self.rules = {
            rule["alert"]: rule
            for group in yaml.safe_load(ALERTS_YAML.read_text())["groups"]
            for rule in group["rules"]
        }
        self.started = time.monotonic()
        self.fired: dict[str, float] = {}
        self.resolved: dict[str, float] = {}
        self.ended: float | None = None

    def _delivered(self, status: str) -> dict[str, dict]:
        found = {}
        for note in notifications(self.ops.alert_sink):
            name = note["labels"]["alertname"]
            if note["at"] < self.started or note["status"] != status or name not in self.expected:
                continue
            if self.expected[name].items() <= note["labels"].items():
                found.setdefault(name, note)
        return found

    def wait_fired(self, timeout: float = 90, meanwhile=None) -> None:
        """Until each expected alert has been delivered firing; `meanwhile()` keeps the
        fault going between looks (a failing job at a time, a slow submit)."""

        def all_fired():
            delivered = self._delivered("firing")
            if len(delivered) == len(self.expected):
                return delivered
            if meanwhile is not None:
                meanwhile()
            return None

        delivered = wait_for(
            all_fired,
            f"{sorted(self.expected)} delivered firing",
            timeout,
            on_timeout=self.ops.state,
        )
        for name, note in delivered.items():
            rule = self.rules[name]
            severity = rule["labels"]["severity"]
            # Routed by severity (the receiver's path is the route's).
            assert note["path"].endswith(f"/{severity}"), (name, note["path"])
            assert note["labels"]["severity"] == severity
            assert set(note["annotations"]) == set(rule["annotations"]), name
            for value in self.expected[name].values():
                assert (
                    value in note["annotations"]["summary"] + note["annotations"]["description"]
                ), (name, note["annotations"])
            self.fired[name] = note["at"] - self.started

    def end(self) -> None:
        self.ended = time.monotonic()

    def _latest(self) -> dict[str, dict]:
        """Each expected alert's last notification since the fault started."""
        found = {}
        for note in notifications(self.ops.alert_sink):
            name = note["labels"]["alertname"]
            if note["at"] < self.started or name not in self.expected:
                continue
            if self.expected[name].items() <= note["labels"].items():
                found[name] = note  # in the order they arrived: the last one stays
        return found

    def wait_resolved(self, timeout: float = 90) -> None:
        """Until each expected alert's last notification says resolved. One may have
        resolved (and even fired again) while the fault went on: a rate that lapsed
        between two failures on a loaded machine; what counts is the state it ends in."""
        assert self.ended is not None

        def all_resolved():
            active = {a["labels"]["alertname"] for a in self.ops.prometheus.alerts()}
            latest = self._latest()
            delivered = {
                n: note
                for n, note in latest.items()
                if note["status"] == "resolved" and n not in active
            }
            return len(delivered) == len(self.expected) and delivered

        delivered = wait_for(
            all_resolved,
            f"{sorted(self.expected)} delivered resolved",
            timeout,
            on_timeout=self.ops.state,
        )
        for name, note in delivered.items():
            self.resolved[name] = max(0.0, note["at"] - self.ended)
        # Nothing else fired meanwhile: the fault raised exactly its alerts.
        others = {
            n["labels"]["alertname"]
            for n in notifications(self.ops.alert_sink)
            if n["at"] >= self.started
            and n["status"] == "firing"
            and n["labels"]["alertname"] not in self.expected
        }
        assert not others, f"unexpected alerts during the fault: {others}"

    def report(self, what: str) -> str:
        fired = {n: round(s, 1) for n, s in self.fired.items()}
        resolved = {n: round(s, 1) for n, s in self.resolved.items()}
        return f"{what}: fired after {fired} s, resolved {resolved} s after the fault ended"


# --- the tests, in order -------------------------------------------------------------------


def test_prometheus_scrapes_every_target_of_composes_configuration(ops):
    shipped = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in shipped["scrape_configs"]}

    def all_up():
        targets = ops.prometheus.targets()
        health = {t["labels"]["job"]: t["health"] for t in targets}
        return set(health) == jobs and all(h == "up" for h in health.values()) and health

    health = wait_for(all_up, "every target scraped", 60, on_timeout=ops.state)
    # Only the API's metrics port names tenants (their usage); what the workers, the
    # webhook deliverer and the relay export names none (docs/security.md).
    named = ops.prometheus.query(
        'count({tenant!="", job=~"diffq-worker|diffq-webhooks|diffq-relay"})'
    )
    assert not named, named
    # The rules loaded are the shipped ones, every duration a sixtieth.
    groups = requests.get(f"{ops.prometheus.url}/api/v1/rules", timeout=10).json()["data"]
    loaded = {r["name"]: r["duration"] for g in groups["groups"] for r in g["rules"]}
    shipped_rules = {
        r["alert"]: r for g in yaml.safe_load(ALERTS_YAML.read_text())["groups"] for r in g["rules"]
    }
    assert set(loaded) == set(shipped_rules)
    for name, rule in shipped_rules.items():
        number, unit = re.fullmatch(r"(\d+)([smh])", rule["for"]).groups()
        seconds = int(number) * {"s": 1, "m": 60, "h": 3600}[unit]
        assert loaded[name] == seconds / SPEEDUP, (name, loaded[name])
    rewritten = ops.prometheus.rules_path.read_text()
    assert all(d.endswith("ms") for d in durations_in_minutes(rewritten)), rewritten
    # Alertmanager is the one Prometheus sends to.
    managers = requests.get(f"{ops.prometheus.url}/api/v1/alertmanagers", timeout=10).json()
    (active,) = managers["data"]["activeAlertmanagers"]
    assert f":{ops.alertmanager.port}/" in active["url"]
    print(f"\ntargets {health}; {len(loaded)} rules; alerts to {active['url']}")


def _cancel_all(ops: Ops) -> None:
    for status in ("queued", "running"):
        listed = requests.get(
            f"{ops.api.url}/v1/jobs",
            params={"status": status, "limit": 100},
            headers=auth(ops.key),
            timeout=10,
        )
        for job in listed.json()["data"]:
            _cancel(ops, job["id"])


def _panel_queries() -> list[tuple[str, str, str]]:
    """(panel title, legend, PromQL) of every dashboard target, with the queue variable
    at Grafana's "All" (its allValue)."""
    dashboard = json.loads((DEPLOY / "grafana" / "diffq-dashboard.json").read_text())
    (queue,) = [v for v in dashboard["templating"]["list"] if v["name"] == "queue"]
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$queue", queue["allValue"])
            queries.append((panel["title"], target.get("legendFormat", ""), expr))
    return queries


def _keda_queries() -> dict[tuple[str, str], str]:
    """Every Prometheus trigger of a ScaledObject in deploy/k8s: (its queue, what it scales
    on: backlog or forecast) -> its query."""
    found = {}
    for path in sorted((DEPLOY / "k8s").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "ScaledObject":
                continue
            for trigger in doc["spec"]["triggers"]:
                if trigger["type"] == "prometheus":
                    query = trigger["metadata"]["query"]
                    queue = query.split('queue="', 1)[1].split('"', 1)[0]
                    on = "forecast" if "diffq_demand_forecast_gpus" in query else "backlog"
                    found[(queue, on)] = query
    return found


def _adapter_query(instance: str) -> str:
    """prometheus-adapter's metricsQuery for the HPA, as the adapter fills it in for one
    pod; here the scrape target's own label stands in for namespace and pod."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "adapter-rules.yaml").read_text())
    (rule,) = config["rules"]["custom"]
    series = rule["seriesQuery"].split("{", 1)[0]
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", f'instance="{instance}"')
        .replace("<<.GroupBy>>", "instance")
    )


def test_every_dashboard_keda_and_hpa_query_answers_with_what_the_test_caused(ops):
    from app.gauges.backlog import FALLBACK_UNIT_SECONDS
    from app.kinds.base import REFERENCE_PIXELS

    key, url = ops.key, ops.api.url
    # Finished jobs of model tiny: three succeed (each with a webhook), two fail on S3,
    # a client asks for a job that is not there, twice. Each a scrape apart: a counter's
    # first increment only creates its series, and rate() sees the increments after it.
    for i in range(3):
        job = submit(url, key, model="tiny", prompt=f"ok {i}", webhook=ops.hooks.url)
        assert wait_terminal(url, key, job["id"], timeout=120)["status"] == "succeeded"
        time.sleep(SCRAPE_APART)
    ops.s3_proxy.down()
    try:
        for _ in range(2):
            failed = submit(url, key, model="tiny", prompt="no storage")
            body = wait_terminal(url, key, failed["id"], timeout=120)
            assert body["error"]["code"] == "storage_unavailable", body
            time.sleep(SCRAPE_APART)
    finally:
        ops.s3_proxy.up()
    for _ in range(2):
        missing = requests.get(f"{url}/v1/jobs/{uuid.uuid4()}", headers=auth(key), timeout=10)
        assert missing.status_code == 404
        time.sleep(SCRAPE_APART)
    # The sdxl pool busy with one long job (canceled at the end), work queued behind it.
    long_job = submit(url, key, prompt="long", steps=900, num_images=4, width=512, height=512)
    wait_for(lambda: _running(ops, long_job["id"]), "the long job running", 60)
    time.sleep(SCRAPE_APART)  # sdxl's submit counter seen before the submits below
    queued = [(10, 1), (20, 2), (30, 4), (7, 3)]
    for steps, images in queued:
        submit(url, key, prompt="queued", steps=steps, num_images=images)
    high = (12, 1)
    submit(url, key, prompt="urgent", steps=high[0], num_images=high[1], priority="high")
    first_queued_at = time.time()
    # Requests held open (Prefer: wait) while the test asks Prometheus: the API's
    # requests in flight, which its HPA scales on.
    holding = 3
    waits = []

    def wait_request():
        try:
            response = requests.post(
                f"{url}/v1/jobs",
                json={"prompt": "waiting", "steps": 1},
                headers={**auth(key), "Prefer": "wait=60"},
                timeout=90,
            )
            waits.append(response.status_code)
        except requests.RequestException as exc:
            waits.append(repr(exc))

    threads = [threading.Thread(target=wait_request) for _ in range(holding)]
    for thread in threads:
        thread.start()
    queued += [(1, 1)] * holding
    # What the test caused, in each figure a panel or a scaler reads.
    # The unit is a step of one 512 x 512 image; these jobs take the default 64 x 64.
    size = 64 * 64 / REFERENCE_PIXELS
    units = sum(steps * images for steps, images in queued) * size
    backlog = {  # sdxl has no success: FALLBACK_UNIT_SECONDS a unit
        "gpu.sdxl": round(units * FALLBACK_UNIT_SECONDS, 3),
        "gpu.sdxl.high": round(high[0] * high[1] * size * FALLBACK_UNIT_SECONDS, 3),
        "gpu.tiny": 0.0,
    }
    depth = {"gpu.sdxl": len(queued), "gpu.sdxl.high": 1, "gpu.tiny": 0}
    running = {"gpu.sdxl": 1, "gpu.sdxl.high": 0, "gpu.tiny": 0}
    dead = {"gpu.sdxl": 0, "gpu.sdxl.high": 0, "gpu.tiny": 2}
    consumers = {queue: 1 for queue in QUEUES}  # the one worker consumes every queue
    api_instance = f"127.0.0.1:{ops.api.metrics_port}"
    worker_instance = f"127.0.0.1:{ops.worker_port}"
    gpu = {"used": 2 * GIB, "total": 8 * GIB, "ratio": 0.6}

    def per_queue(expected):
        return lambda rows: _by(rows, "queue") == {(q,): float(v) for q, v in expected.items()}

    def finite(low, high_):
        return lambda rows: rows and all(low < r["value"] <= high_ for r in rows)

    def each(label_sets, check=lambda v: v > 0):
        return lambda rows: (
            set(_by(rows, *label_sets[0])) == set(label_sets[1])
            and all(check(r["value"]) for r in rows)
        )

    def gpu_series(value):
        return lambda rows: _by(rows, "instance", "gpu") == {(worker_instance, "0"): value}

    statuses = (("status",), {("200",), ("202",), ("404",)})
    checks = {
        ("Submit latency (POST /v1/jobs) p50 / p99", "p50"): finite(0, 10),
        ("Submit latency (POST /v1/jobs) p50 / p99", "p99"): finite(0, 10),
        ("HTTP requests by status", "{{status}}"): each(statuses),
        ("Jobs submitted per second by model", "{{model}}"): each(
            (("model",), {("sdxl",), ("tiny",)})
        ),
        # Every error code's series exists from the start at 0: those caused are above it.
        ("Jobs finished by status / error code", "{{status}} {{error_code}}"): lambda rows: (
            {k for k, v in _by(rows, "status", "error_code").items() if v > 0}
            == {("succeeded", ""), ("failed", "storage_unavailable")}
            and all(r["value"] >= 0 for r in rows)
        ),
        ("Job error rate", "all models"): finite(0, 0.999),
        # sdxl has finished nothing: no ratio; tiny failed two jobs in five.
        ("Job error rate", "{{model}}"): each((("model",), {("tiny",)}), lambda v: 0 < v < 1),
        ("Generation duration p50 / p95 by model", "{{model}} p50"): each(
            (("model",), {("tiny",)}), lambda v: 0 < v <= 600
        ),
        ("Generation duration p50 / p95 by model", "{{model}} p95"): each(
            (("model",), {("tiny",)}), lambda v: 0 < v <= 600
        ),
        ("Mean step time by model", "{{model}}"): each(
            (("model",), {("tiny",)}), lambda v: 0 < v < 60
        ),
        ("Broker up", "broker"): lambda rows: [r["value"] for r in rows] == [1.0],
        ("Jobs queued", "queued"): lambda rows: (
            [r["value"] for r in rows] == [float(sum(depth.values()))]
        ),
        ("Consumers", "consumers"): lambda rows: (
            [r["value"] for r in rows] == [float(sum(consumers.values()))]
        ),
        ("Dead letters", "dead letters"): lambda rows: (
            [r["value"] for r in rows] == [float(sum(dead.values()))]
        ),
        ("Queue depth", "{{queue}}"): per_queue(depth),
        ("Oldest queued job age", "{{queue}}"): lambda rows: (
            (ages := _by(rows, "queue"))
            and set(ages) == {(q,) for q in QUEUES}
            and ages[("gpu.tiny",)] == 0
            and time.time() - first_queued_at - 5 <= ages[("gpu.sdxl.high",)]
            and ages[("gpu.sdxl",)] >= ages[("gpu.sdxl.high",)] - 1
        ),
        ("Jobs in flight", "{{queue}}"): per_queue(running),
        ("Ready broker messages", "{{queue}}"): per_queue(depth),
        ("Consumers by queue", "{{queue}}"): per_queue(consumers),
        ("DLQ depth", "{{queue}}"): per_queue(dead),
        ("Broker up by API replica", "{{instance}}"): lambda rows: (
            _by(rows, "instance") == {(api_instance,): 1.0}
        ),
        ("Worker busy fraction", "{{worker}}"): lambda rows: (
            len(rows) == 1 and 0 < rows[0]["value"] <= 1.05
        ),
        ("GPU utilization", "{{instance}} gpu {{gpu}}"): gpu_series(gpu["ratio"]),
        ("GPU memory used / total", "{{instance}} gpu {{gpu}} used"): gpu_series(gpu["used"]),
        ("GPU memory used / total", "{{instance}} gpu {{gpu}} total"): gpu_series(gpu["total"]),
        ("GPU memory used fraction", "{{instance}} gpu {{gpu}}"): gpu_series(
            gpu["used"] / gpu["total"]
        ),
    }
    panels = _panel_queries()
    assert {(title, legend) for title, legend, _ in panels} == set(checks), (
        "every panel query needs its expected answer here"
    )
    keda = _keda_queries()
    assert set(keda) == {
        ("gpu.sdxl", "backlog"),
        ("gpu.sdxl.high", "backlog"),
        ("gpu.sdxl", "forecast"),
    }, keda
    hpa = _adapter_query(api_instance)

    def answers() -> dict[str, object]:
        """Every query's answer, and which of them are not what the test caused."""
        wrong = {}
        answered = {}
        for title, legend, expr in panels:
            rows = ops.prometheus.query(expr)
            answered[f"{title} [{legend}]"] = rows
            if not checks[(title, legend)](rows):
                wrong[f"{title} [{legend}]"] = rows
        for (queue, on), expr in keda.items():
            rows = ops.prometheus.query(expr)
            answered[f"KEDA {queue} {on}"] = rows
            # sdxl has no success yet: no GPU-seconds a job to forecast with.
            expected = backlog[queue] + 600 * running[queue] if on == "backlog" else 0.0
            if [r["value"] for r in rows] != [expected]:
                wrong[f"KEDA {queue} (expected {expected})"] = rows
        rows = ops.prometheus.query(hpa)
        answered["HPA"] = rows
        if _by(rows, "instance") != {(api_instance,): float(holding)}:
            wrong[f"HPA (expected {holding})"] = rows
        variable = ops.prometheus.label_values("queue", "diffq_queue_depth")
        if sorted(variable) != QUEUES:
            wrong["queue variable"] = variable
        forecast = ops.prometheus.label_values("queue", "diffq_demand_forecast_gpus")
        if sorted(forecast) != QUEUES:  # a series for every queue, 0 without history
            wrong["forecast series"] = forecast
        return {"wrong": wrong, "answered": answered}

    last: dict = {}

    def all_right():
        last.update(answers())
        return not last["wrong"]

    try:
        wait_for(all_right, "every query answering as caused", 30, on_timeout=lambda: last["wrong"])
        # Still the state the figures were computed for.
        assert _running(ops, long_job["id"]) and all(t.is_alive() for t in threads)
    except BaseException:
        _cancel_all(ops)  # the held requests return
        _purge_dead_letters(ops)
        raise
    answered = last["answered"]
    assert all(not math.isnan(r["value"]) for rows in answered.values() for r in rows)
    print(
        f"\n{len(panels)} panel queries, {len(keda)} KEDA triggers and the HPA's query "
        f"answered as caused: KEDA gpu.sdxl {answered['KEDA gpu.sdxl backlog'][0]['value']} "
        f"({units} units queued + 600 x 1 running), its forecast "
        f"{answered['KEDA gpu.sdxl forecast'][0]['value']} GPUs (no success yet), "
        f"gpu.sdxl.high {answered['KEDA gpu.sdxl.high backlog'][0]['value']}, "
        f"HPA {answered['HPA'][0]['value']} requests in flight"
    )

    # The same busy pool on a GPU that idles with memory nearly full: both GPU alerts.
    watch = AlertWatch(
        ops,
        {
            "DiffqGpuUtilizationLow": {"gpu": "0", "instance": worker_instance},
            "DiffqGpuMemoryNearlyFull": {"gpu": "0", "instance": worker_instance},
        },
    )
    ops.nvml.set(used=int(7.8 * GIB), total=8 * GIB, utilization=5)
    watch.wait_fired()
    watch.end()
    ops.nvml.set(used=2 * GIB, total=8 * GIB, utilization=60)
    watch.wait_resolved()
    print(watch.report("GPU idle and memory full (stand-in NVML)"))
    assert _running(ops, long_job["id"])  # sdxl still has no success (its backlog: 1 s a unit)
    _cancel_all(ops)
    _purge_dead_letters(ops)
    for thread in threads:
        thread.join(timeout=90)
    # Each held request answered once its job ended (canceled).
    assert waits == [200] * holding, waits
    _wait_idle(ops)


def test_gpu_workers_stopped_raise_no_consumer_backlog_and_oldest_job_alerts(ops):
    from app.gauges.backlog import FALLBACK_UNIT_SECONDS

    _wait_idle(ops)
    url, key = ops.api.url, ops.key
    stranded, steps, images = 21, 25, 4  # 21 jobs per (at least one) consumer: over 20
    side = 512  # the reference size: a unit is a step of one 512 x 512 image
    backlog = stranded * steps * images * FALLBACK_UNIT_SECONDS  # sdxl: no success yet
    watch = AlertWatch(
        ops,
        {
            "DiffqNoConsumer": {"queue": "gpu.sdxl"},
            "DiffqQueueBacklogPerWorker": {"queue": "gpu.sdxl"},
            "DiffqGpuBacklogHigh": {"queue": "gpu.sdxl"},
            "DiffqOldestJobWaiting": {"queue": "gpu.sdxl"},
        },
    )
    assert backlog > 1800  # DiffqGpuBacklogHigh's threshold per consumer
    ops.worker.stop()
    ids = [
        submit(
            url,
            key,
            prompt=f"stranded {i}",
            steps=steps,
            num_images=images,
            width=side,
            height=side,
        )["id"]
        for i in range(stranded)
    ]
    # Waiting over 600 s cannot be sped up: the first job is made 11 minutes old.
    _sql(
        ops, "UPDATE jobs SET created_at = created_at - interval '11 minutes' WHERE id = %s", ids[0]
    )
    watch.wait_fired()
    notes = {n["labels"]["alertname"]: n for n in notifications(ops.alert_sink)}
    assert notes["DiffqQueueBacklogPerWorker"]["annotations"]["summary"] == (
        f"Queue gpu.sdxl has {stranded} queued jobs per consumer"
    )
    minutes, seconds = divmod(int(backlog), 60)
    assert notes["DiffqGpuBacklogHigh"]["annotations"]["summary"] == (
        f"Queue gpu.sdxl holds {minutes}m {seconds}s of GPU work per consumer"
    )
    assert "has waited 11m" in notes["DiffqOldestJobWaiting"]["annotations"]["summary"]
    # The fault ends: the stranded jobs are canceled (at 512 x 512 they would take the CPU
    # minutes), the worker is back, drains the queue and runs new work.
    watch.end()
    for job_id in ids:
        _cancel(ops, job_id)
    ops.start_worker()
    watch.wait_resolved(timeout=180)
    for job_id in ids:
        assert wait_terminal(url, key, job_id, timeout=60)["status"] == "canceled"
    after = submit(url, key, prompt="after the fault", steps=2)
    assert wait_terminal(url, key, after["id"], timeout=60)["status"] == "succeeded"
    print(watch.report(f"GPU workers stopped, {stranded} jobs ({backlog:.0f} GPU-s) stranded"))


def test_poison_jobs_in_the_dead_letter_queue_raise_dead_letters_and_error_rate(ops):
    _wait_idle(ops)
    url, key = ops.api.url, ops.key
    watch = AlertWatch(ops, {"DiffqDeadLetters": {"queue": "gpu.tiny"}, "DiffqJobErrorRate": {}})
    failed = []

    def one_more_failure():
        job = submit(url, key, model="tiny", prompt="poison", steps=1)
        body = wait_terminal(url, key, job["id"], timeout=60)
        assert body["status"] == "failed" and body["error"]["code"] == "storage_unavailable"
        failed.append(job["id"])

    ops.s3_proxy.down()  # every job of the model fails and is dead-lettered
    try:
        watch.wait_fired(meanwhile=one_more_failure)
    finally:
        # The fault ends: storage back, the dead letters purged (the runbook's command).
        watch.end()
        ops.s3_proxy.up()
    _purge_dead_letters(ops)
    watch.wait_resolved()
    print(watch.report(f"{len(failed)} poison jobs failed and dead-lettered"))


def test_broker_down_raises_broker_down(ops):
    _wait_idle(ops)
    watch = AlertWatch(ops, {"DiffqBrokerDown": {}})
    ops.rabbit.stop()  # the test's own node: nothing else uses it
    try:
        watch.wait_fired()
    finally:
        watch.end()
        ops.rabbit.start()
    watch.wait_resolved()
    _wait_idle(ops)  # the workers consume again
    print(watch.report("RabbitMQ stopped"))


def test_a_stopped_relay_raises_relay_stalled(ops):
    """The relay gone (its passes no longer scraped): DiffqRelayStalled pages, and clears
    once a relay passes again."""
    _wait_idle(ops)
    watch = AlertWatch(ops, {"DiffqRelayStalled": {}})
    assert ops.prometheus.query('sum(diffq_relay_passes_total{outcome="ok"})')[0]["value"] > 0
    ops.relay.stop()
    try:
        watch.wait_fired()
    finally:
        watch.end()
        ops.relay.start()
    watch.wait_resolved()
    print(watch.report("the relay stopped"))


def test_failing_webhook_deliveries_raise_webhook_deliveries_failing(ops):
    _wait_idle(ops)
    url, key = ops.api.url, ops.key
    watch = AlertWatch(ops, {"DiffqWebhookDeliveriesFailing": {}})
    ops.hooks.default = Answer(500)  # the client's endpoint fails every delivery
    try:
        for i in range(3):
            job = submit(url, key, model="tiny", prompt=f"hook {i}", steps=1, webhook=ops.hooks.url)
            assert wait_terminal(url, key, job["id"], timeout=60)["status"] == "succeeded"
        watch.wait_fired()
    finally:
        watch.end()
        ops.hooks.default = Answer(200)
    watch.wait_resolved()
    answered = [r.answered for r in ops.hooks.requests() if r.at >= watch.started]
    assert answered.count(500) >= 3 and answered[-1] == 200, answered
    print(watch.report(f"webhook endpoint answering 500 ({answered.count(500)} failed attempts)"))


def test_submits_held_by_a_database_lock_raise_submit_latency(ops):
    _wait_idle(ops)
    url, key = ops.api.url, ops.key
    watch = AlertWatch(ops, {"DiffqSubmitLatencyHigh": {}})
    stop = threading.Event()

    def hold_the_jobs_table():
        # A lock taken again and again (a long migration, a stray transaction): each
        # submit's INSERT waits up to a second.
        conn = psycopg2.connect(ops.database_url.replace("postgresql+psycopg2://", "postgresql://"))
        try:
            while not stop.is_set():
                with conn, conn.cursor() as cur:
                    cur.execute("LOCK TABLE jobs IN SHARE MODE")
                    stop.wait(1.0)
                time.sleep(0.05)
        finally:
            conn.close()

    locker = threading.Thread(target=hold_the_jobs_table)
    locker.start()
    submitted = []
    try:
        watch.wait_fired(
            meanwhile=lambda: submitted.append(
                submit(url, key, model="tiny", prompt="slow", steps=1)["id"]
            )
        )
    finally:
        watch.end()
        stop.set()
        locker.join(timeout=10)
    watch.wait_resolved()
    print(watch.report(f"jobs table locked, {len(submitted)} slow submits"))


def test_no_api_replica_scraped_raises_queue_readings_absent(ops):
    _wait_idle(ops)
    watch = AlertWatch(ops, {"DiffqQueueReadingsAbsent": {}})
    ops.api.stop()
    try:
        watch.wait_fired()
    finally:
        watch.end()
        ops.api.start()
    watch.wait_resolved()
    print(watch.report("the API stopped"))
