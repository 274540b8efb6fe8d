"""The deployment runs: every role of deploy/compose.yaml and of the rendered production
overlay, started as a local process from its own command and environment, serves a job
end to end with a signed webhook, then a cancel; every probe it declares answers.

A role that is missing (no relay: no webhook; no worker: no job), mis-wired (a wrong
queue, a missing mount, an unset secret) or whose probe points nowhere fails here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest
import requests
import yaml
from standardwebhooks.webhooks import Webhook

from testbed import services
from testbed.deployment import (
    DEPLOY,
    SECRET_KEYS,
    LocalRole,
    compose_workloads,
    kubernetes_workloads,
    kustomize,
    localize,
)
from testbed.faultproxy import FaultProxy
from testbed.jobs import auth, submit, wait_terminal
from testbed.processes import ManagedProcess
from testbed.receiver import Receiver

pytestmark = pytest.mark.services

# Roles a deployment must have, by what each one runs.
ROLES = {
    "migrate": ("db", "upgrade"),
    "api": ("api",),
    "relay": ("relay",),
    "webhooks": ("webhooks",),
    "worker": ("worker",),
    "flower": ("flower",),
}
FLOWER_AUTH = "ops:flower-test-password"


def _role_of(role: LocalRole) -> str:
    args = role.workload.command[1:]
    for name, head in ROLES.items():
        if tuple(args[: len(head)]) == head:
            return name
    raise AssertionError(f"{role.workload.name} runs an unknown command {role.workload.command}")


def _models_dir(tmp_path, tiny, model_files: list[str]):
    """The model volume: the tiny model under every name a catalog expects at /models."""
    models = tmp_path / "models-volume"
    models.mkdir()
    for text in model_files:
        for name in re.findall(r'path\s*=\s*"/models/([^"/]+)"', text):
            if not (models / name).exists():
                (models / name).symlink_to(tiny)
    return models


def _wait(check, what: str, timeout: float, processes: list[ManagedProcess]):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (requests.RequestException, OSError, ProbeFailed) as exc:
            last = exc
        for process in processes:
            if process.process.poll() is not None:
                raise AssertionError(
                    f"{process.name} exited with {process.process.returncode} while waiting "
                    f"for {what}:\n{process.log()[-3000:]}"
                )
        time.sleep(0.2)
    logs = "\n".join(f"--- {p.name}\n{p.log()[-1500:]}" for p in processes)
    raise AssertionError(f"{what}: not within {timeout}s ({last})\n{logs}")


class ProbeFailed(Exception):
    pass


def _probe_ok(role: LocalRole) -> list[str]:
    """Every probe of the role, run here; returns what answered, raises ProbeFailed."""
    answered = []
    for kind, target in role.probe_checks():
        if kind == "http":
            response = requests.get(target, timeout=5)
            if response.status_code != 200:
                raise ProbeFailed(f"{role.workload.name}: {target}: {response.text}")
        elif kind == "tcp":
            socket.create_connection(("127.0.0.1", target), timeout=5).close()
        else:
            done = subprocess.run(target, capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                raise ProbeFailed(f"{role.workload.name}: {target}: {done.stderr[-500:]}")
        answered.append(f"{kind} {target if kind != 'exec' else ' '.join(target)[:60]}")
    return answered


def _liveness_url(role: LocalRole) -> str:
    """The worker's /healthz, as its probe (httpGet, or a compose healthcheck) calls it."""
    for kind, target in role.probe_checks():
        text = target if kind == "http" else " ".join(map(str, target))
        found = re.search(r"http://127\.0\.0\.1:\d+/healthz", str(text))
        if found:
            return found.group(0)
    raise AssertionError(f"{role.workload.name} has no liveness probe on /healthz")


def _cli(role: LocalRole, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "cli", *args],
        env=role.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _run_deployment(source: str, stack, tmp_path) -> None:
    run = uuid.uuid4().hex[:8]
    db_name, vhost = f"diffq_deploy_{run}", f"diffq-deploy-{run}"
    database_url = services.create_database(db_name)
    broker_url = services.create_vhost(vhost)
    # The deployment reaches RabbitMQ through a proxy whose link the end of the test cuts.
    parts = urlsplit(broker_url)
    proxy = FaultProxy(parts.port or 5672).start()
    broker_url = urlunsplit(parts._replace(netloc=f"{parts.netloc.rsplit(':', 1)[0]}:{proxy.port}"))
    s3 = stack.s3.env("unused")
    secrets = {
        "DIFFQ_DATABASE_URL": database_url,
        "DIFFQ_BROKER_URL": broker_url,
        "DIFFQ_S3_ENDPOINT_URL": s3["DIFFQ_S3_ENDPOINT_URL"],
        "AWS_ACCESS_KEY_ID": s3["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": s3["AWS_SECRET_ACCESS_KEY"],
        "DIFFQ_RABBITMQ_API_URL": "http://guest:guest@127.0.0.1:15672/api/",
        # The receiver below listens on loopback, which the SSRF guard refuses otherwise.
        "DIFFQ_WEBHOOK_ALLOW_CIDRS": "127.0.0.0/8",
    }
    if source == "compose":
        variables = {
            "POSTGRES_PASSWORD": "unused",
            "RABBITMQ_PASSWORD": "unused",
            "S3_ACCESS_KEY": "unused",
            "S3_SECRET_KEY": "unused",
            "FLOWER_AUTH": FLOWER_AUTH,
            "GRAFANA_PASSWORD": "unused",
            "S3_PUBLIC_URL": s3["DIFFQ_S3_ENDPOINT_URL"],
        }
        workloads = compose_workloads(variables)
        # Before the secrets are swapped for this run's: each points at a compose service.
        defined = set(yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"])
        for workload in workloads:
            for key in ("DIFFQ_DATABASE_URL", "DIFFQ_BROKER_URL", "DIFFQ_S3_ENDPOINT_URL"):
                assert urlsplit(workload.env[key]).hostname in defined, (workload.name, key)
        model_files = [m.files["models.toml"] for w in workloads for m in w.mounts if m.files]
    else:
        if shutil.which("kubectl") is None:
            pytest.skip("kubectl is not installed: cannot render the Kubernetes overlays")
        docs = kustomize("production")
        workloads = kubernetes_workloads(docs)
        model_files = [d["data"]["models.toml"] for d in docs if d["kind"] == "ConfigMap"]
        secrets["DIFFQ_FLOWER_AUTH"] = FLOWER_AUTH
        # An operator's step (README): this overlay does not create the bucket.
        bucket = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["DIFFQ_STORAGE_URL"]
        client = stack.s3.client()
        if bucket[5:] not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            client.create_bucket(Bucket=bucket[5:])
    models_dir = _models_dir(tmp_path, stack.tiny_model, model_files)
    roles = [localize(w, tmp_path / source, models_dir, secrets) for w in workloads]
    for role in roles:
        for key in SECRET_KEYS:
            assert key not in role.workload.env or role.env[key] == secrets[key], key
        role.env["DIFFQ_WEBHOOK_ALLOW_CIDRS"] = secrets["DIFFQ_WEBHOOK_ALLOW_CIDRS"]
    by_role: dict[str, list[LocalRole]] = {}
    for role in roles:
        by_role.setdefault(_role_of(role), []).append(role)
    missing = sorted(set(ROLES) - set(by_role))
    assert not missing, f"{source}: no workload runs {missing}"

    processes: list[ManagedProcess] = []
    receiver = Receiver().start()
    started = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - started, 1)

    try:
        # The migrate Job/service first, twice: a rollout may run it again.
        for attempt in (1, 2):
            (migrate,) = by_role["migrate"]
            done = subprocess.run(migrate.args, env=migrate.env, capture_output=True, timeout=120)
            assert done.returncode == 0, (attempt, done.stderr.decode()[-2000:])
            phase(f"migrate {attempt}")
        for name in ("api", "relay", "webhooks", "worker", "flower"):
            for role in by_role[name]:
                process = ManagedProcess(
                    f"{source}-{role.workload.name}", role.args, role.env, stack.logs
                )
                processes.append(process.start())
        (api,) = by_role["api"]
        api_url = f"http://127.0.0.1:{api.ports[8000]}"
        # Ready as its readiness probe says, with the broker and the workers just starting.
        _wait(lambda: _probe_ok(api), "API ready (its probes)", 60, processes)
        phase("api ready")
        for role in by_role["worker"] + by_role["webhooks"]:
            health = _liveness_url(role)
            _wait(
                lambda h=health: requests.get(h, timeout=5).json()["state"] == "consuming",
                f"{role.workload.name} consuming",
                180,
                processes,
            )
        phase("workers consuming")
        key = _cli(api, "keys", "create", "--tenant", f"deploy-{run}")
        secret = _cli(api, "webhook-secret", "--tenant", f"deploy-{run}")

        job = submit(
            api_url, key, prompt="deployed", steps=2, width=64, height=64, webhook=receiver.url
        )
        done = wait_terminal(api_url, key, job["id"], timeout=120)
        assert done["status"] == "succeeded", done
        image = requests.get(done["result"]["images"][0]["url"], timeout=10)
        assert image.status_code == 200 and image.content[:4] == b"\x89PNG"
        event = _wait(
            lambda: [r for r in receiver.requests() if job["id"] in r.body.decode()],
            "the job.succeeded webhook",
            60,
            processes,
        )[0]
        verified = Webhook(secret).verify(event.body, event.headers)
        assert verified["type"] == "job.succeeded" and verified["data"]["id"] == job["id"]

        phase("job + webhook")
        # Long enough to still be queued or running when the cancel lands.
        victim = submit(
            api_url, key, prompt="cancel me", steps=80, width=64, height=64, webhook=receiver.url
        )
        cancel = requests.post(
            f"{api_url}/v1/jobs/{victim['id']}/cancel", headers=auth(key), timeout=10
        )
        assert cancel.status_code == 200, cancel.text
        assert wait_terminal(api_url, key, victim["id"], timeout=60)["status"] == "canceled"
        event = _wait(
            lambda: [r for r in receiver.requests() if victim["id"] in r.body.decode()],
            "the job.canceled webhook",
            60,
            processes,
        )[0]
        assert Webhook(secret).verify(event.body, event.headers)["type"] == "job.canceled"

        phase("cancel + webhook")
        (flower,) = by_role["flower"]
        flower_url = f"http://127.0.0.1:{flower.ports[5555]}/"
        _wait(
            lambda: requests.get(flower_url, timeout=5).status_code == 401,
            "Flower asking for a password",
            60,
            processes,
        )
        user, password = FLOWER_AUTH.split(":")
        assert requests.get(flower_url, auth=(user, password), timeout=10).status_code == 200
        # Every probe every role declares answers, on the port or path it names.
        answered = {
            r.workload.name: _wait(
                lambda r=r: _probe_ok(r) or ["none declared"], f"{r.workload.name} probes", 30, []
            )
            for r in roles
            if r not in by_role["migrate"]
        }
        phase("flower + probes")

        # The broker goes away: the API stays ready and accepts jobs (the outbox keeps
        # them), and the workers stay alive, waiting for it, instead of being restarted.
        proxy.down()
        seen: dict[str, set[str]] = {}
        deadline = time.monotonic() + 20
        roles_away = by_role["worker"] + by_role["webhooks"]
        while time.monotonic() < deadline:
            for role in roles_away:
                answer = requests.get(_liveness_url(role), timeout=5)
                # Liveness holds through the outage: no pod is restarted for it.
                assert answer.status_code == 200, (role.workload.name, answer.text)
                seen.setdefault(role.workload.name, set()).add(answer.json()["state"])
            if all("reconnecting" in states for states in seen.values()):
                break
            time.sleep(0.5)
        print(f"\nliveness states during the broker outage: {seen}")
        ready = requests.get(f"{api_url}/readyz", timeout=10)
        assert ready.status_code == 200 and ready.json()["checks"]["broker"] != "ok", ready.text
        assert (
            submit(api_url, key, prompt="while the broker is away", steps=2)["status"] == "queued"
        )
        proxy.up()
        phase("broker outage")
        print(
            f"\n{source}: {len(roles)} workloads, job succeeded + signed webhook, cancel "
            f"delivered; seconds since start: {phases}; probes: {answered}"
        )
    finally:
        receiver.stop()
        proxy.up()
        for process in processes:  # all at once, then wait for each
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.stop(timeout=40)
        phase("stopped")
        print(f"{source}: stopped at {phases['stopped']}s")
        services.drop_database(db_name)
        services.delete_vhost(vhost)
        proxy.stop()


@pytest.mark.parametrize("source", ["compose", "kubernetes"])
def test_the_deployment_runs_a_job_with_a_signed_webhook_and_a_cancel(source, stack, tmp_path):
    _run_deployment(source, stack, tmp_path)
