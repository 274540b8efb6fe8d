"""Prometheus and Alertmanager as the operators run them, started from deploy/'s own files
on free loopback ports, for tests that cause alerts on a running diffq.

What is changed to run them here, and nothing else: compose's service addresses in
prometheus.yml (api:9806, worker:9808, webhooks:9807, alertmanager:9093) become the local
processes' ports and the rule file's container path the rewritten copy; the scrape and
evaluation intervals become a second; alerts.yaml is rewritten with every duration in
minutes read as seconds (`for: 10m` holds 10 s, `rate(...[5m])` looks back 5 s: the
same rules on a clock 60 times faster; thresholds untouched); alertmanager.yml's
receiver URLs point at a receiver of the test (path kept, so the severity's route shows)
and its grouping waits become a second.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import requests
import yaml

from testbed.ports import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
ALERTS_YAML = DEPLOY / "prometheus" / "alerts.yaml"
ALERTMANAGER_YML = DEPLOY / "alertmanager" / "alertmanager.yml"
# A stand-in for NVML (the GPU driver's library) for a worker on a machine without GPUs.
NVML_STANDIN = Path(__file__).resolve().parent / "nvml"
SPEEDUP = 60  # minutes in the shipped rules become seconds


def binary(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def _faster(number: str, unit: str) -> str:
    seconds = int(number) * {"s": 1, "m": 60, "h": 3600}[unit]
    return f"{seconds * 1000 // SPEEDUP}ms"


def seconds_for_minutes(text: str) -> str:
    """alerts.yaml on a clock SPEEDUP times faster: `for:` and range selectors only."""
    text = re.sub(
        r"(?m)^(\s*for:\s*)(\d+)([smh])\s*$",
        lambda m: m.group(1) + _faster(m.group(2), m.group(3)),
        text,
    )
    return re.sub(r"\[(\d+)([smh])\]", lambda m: f"[{_faster(m.group(1), m.group(2))}]", text)


def durations_in_minutes(text: str) -> list[str]:
    """Every `for:` and range of a rule file (to check that the rewrite took them all)."""
    return re.findall(r"(?m)^\s*for:\s*(\S+)", text) + re.findall(r"\[(\d+(?:ms|[smh]))\]", text)


class Prometheus:
    def __init__(self, workdir: Path, addresses: dict[str, str]) -> None:
        """`addresses`: compose's host:port of each target (and the Alertmanager) ->
        where it listens here."""
        self.exe = binary("prometheus")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.rules_path = workdir / "alerts.yaml"
        self.rules_path.write_text(seconds_for_minutes(ALERTS_YAML.read_text()))
        config = yaml.safe_load(PROMETHEUS_YML.read_text())
        config["global"] = {
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "evaluation_interval": "1s",
        }
        config["rule_files"] = [str(self.rules_path) for _ in config["rule_files"]]
        for section in [*config["scrape_configs"], *config["alerting"]["alertmanagers"]]:
            for static in section["static_configs"]:
                static["targets"] = [addresses[t] for t in static["targets"]]
        self.config = config
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> Prometheus:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                self.exe,
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--rules.alert.resend-delay=1s",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_port(self.port, timeout=30)
        return self

    def stop(self) -> None:
        _stop(self.process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _api(self, path: str, **params) -> dict | list:
        response = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = response.json()
        assert body.get("status") == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query: [{metric: labels, value: float}], as an HTTP client of the
        query API (Grafana, KEDA, prometheus-adapter) gets it."""
        data = self._api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def label_values(self, label: str, match: str) -> list[str]:
        return self._api(f"label/{label}/values", **{"match[]": match})

    def targets(self) -> list[dict]:
        return self._api("targets")["activeTargets"]

    def alerts(self) -> list[dict]:
        return self._api("alerts")["alerts"]


class Alertmanager:
    def __init__(self, workdir: Path, receiver_url: str) -> None:
        self.exe = binary("prometheus-alertmanager", "alertmanager")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        config = yaml.safe_load(ALERTMANAGER_YML.read_text())
        for key in ("group_wait", "group_interval"):
            config["route"][key] = "1s"
        for route in config["route"].get("routes", []):
            for key in ("group_wait", "group_interval"):
                route.pop(key, None)
        local = urlsplit(receiver_url)
        for receiver in config["receivers"]:
            for hook in receiver["webhook_configs"]:
                hook["url"] = urlsplit(hook["url"])._replace(netloc=local.netloc).geturl()
                hook["url"] = hook["url"].replace("https://", "http://", 1)
        self.config = config
        (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config))
        self.log_path = workdir / "alertmanager.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> Alertmanager:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                self.exe,
                f"--config.file={self.workdir / 'alertmanager.yml'}",
                f"--storage.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",  # no gossip port: one instance, loopback only
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_port(self.port, timeout=30)
        return self

    def stop(self) -> None:
        _stop(self.process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def notifications(receiver) -> list[dict]:
    """Every alert Alertmanager delivered to `receiver` (testbed.receiver.Receiver), one
    entry per alert per notification: its status, labels, annotations, the receiver's
    path (the route) and when it arrived."""
    delivered = []
    for request in receiver.requests():
        body = json.loads(request.body)
        for alert in body["alerts"]:
            delivered.append(
                {
                    "path": request.path,
                    "status": alert["status"],
                    "labels": alert["labels"],
                    "annotations": alert["annotations"],
                    "at": request.at,
                }
            )
    return delivered


class NvmlStandIn:
    """What the stand-in NVML reports (testbed/nvml/pynvml.py reads this file at each
    call): memory used and total in bytes and utilization in percent, per GPU index."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def set(self, *, used: int, total: int, utilization: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"used": used, "total": total, "gpu": utilization}))
        tmp.replace(self.path)

    def env(self) -> dict[str, str]:
        return {"NVML_STANDIN_FILE": str(self.path)}


def _stop(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait(timeout=10)


def wait_for(check, what: str, timeout: float, interval: float = 0.5, on_timeout=None):
    """Poll `check` until it returns something truthy; fail with `what` and, where given,
    `on_timeout()`'s account of the state."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (requests.RequestException, KeyError, ValueError) as exc:
            last = exc
        time.sleep(interval)
    detail = on_timeout() if on_timeout else ""
    raise AssertionError(f"{what}: not within {timeout}s (last error: {last})\n{detail}")
