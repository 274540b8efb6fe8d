"""Workloads read from deploy/: compose services and rendered Kubernetes manifests, as
written (command, environment, mounts, probes), ready to run as local processes.

What is changed to run them here, and nothing else: container paths map to folders of
this run (each mount to its own folder, the ConfigMap's or bind-mounted files copied
in, the model volume holding the tiny model under the names the catalog expects);
`diffq` is this checkout's CLI; 0.0.0.0 binds become loopback and each listening port a
free one; the secrets' values become this run's database, vhost and S3 server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from testbed.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
# Ports diffq's roles listen on in a container (API, webhook, GPU worker and relay
# metrics, Flower).
LISTEN_PORTS = (8000, 9806, 9807, 9808, 9809, 5555)
# Paths private to a container: each role gets its own folder for them.
PRIVATE_PATHS = ("/tmp", "/var/lib/diffq", "/run/diffq")
SECRET_KEYS = (
    "DIFFQ_DATABASE_URL",
    "DIFFQ_BROKER_URL",
    "DIFFQ_S3_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "DIFFQ_RABBITMQ_API_URL",
)


@dataclass
class Mount:
    path: str  # inside the container
    kind: str  # config | models | scratch | file
    files: dict[str, str] = field(default_factory=dict)  # config: name -> content


@dataclass
class Workload:
    """One role's container as the manifests describe it."""

    name: str
    command: list[str]
    env: dict[str, str]
    mounts: list[Mount]
    probes: dict[str, dict]  # liveness/readiness: k8s probe objects or compose healthchecks
    kind: str  # Deployment, Job, service
    port_names: dict[str, int] = field(default_factory=dict)


@dataclass
class LocalRole:
    """A workload turned into a local command: what runs, where its ports went."""

    workload: Workload
    args: list[str]
    env: dict[str, str]
    ports: dict[int, int]  # container port -> local port
    paths: dict[str, Path]  # container path -> local path

    def local_path(self, text: str) -> str:
        # One pass, longest first: a local folder may itself lie under /tmp.
        inside = "|".join(re.escape(p) for p in sorted(self.paths, key=len, reverse=True))
        pattern = rf"(?<![\w/])({inside})(?=/|\b|$)"
        return re.sub(pattern, lambda m: str(self.paths[m.group(1)]), text)

    def local_text(self, text: str) -> str:
        """Paths, binds and ports of the container, as they are in this run."""
        text = self.local_path(text).replace("0.0.0.0", "127.0.0.1")
        for inside, outside in self.ports.items():
            text = re.sub(rf"(?<![\d.]){inside}(?!\d)", str(outside), text)
        return text

    def probe_checks(self) -> list[tuple[str, object]]:
        """Each probe as ('http', url) / ('tcp', port) / ('exec', argv), made local."""
        checks: list[tuple[str, object]] = []
        named = self.workload.port_names
        for probe in self.workload.probes.values():
            if "httpGet" in probe:
                port = probe["httpGet"]["port"]
                port = named.get(port, port)
                url = f"http://127.0.0.1:{self.ports[int(port)]}{probe['httpGet']['path']}"
                checks.append(("http", url))
            elif "tcpSocket" in probe:
                port = probe["tcpSocket"]["port"]
                checks.append(("tcp", self.ports[int(named.get(port, port))]))
            elif "exec" in probe:
                checks.append(("exec", [self.local_text(a) for a in probe["exec"]["command"]]))
            elif "test" in probe:  # a compose healthcheck
                argv = [self.local_text(a) for a in probe["test"][1:]]
                checks.append(("exec", [sys.executable if a == "python" else a for a in argv]))
        return checks


# --- reading the manifests -------------------------------------------------------------


def kustomize(overlay: str) -> list[dict]:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def example_secrets() -> dict[str, dict[str, str]]:
    docs = yaml.safe_load_all((DEPLOY / "k8s" / "secret.example.yaml").read_text())
    return {d["metadata"]["name"]: d["stringData"] for d in docs if d}


def kubernetes_workloads(docs: list[dict]) -> list[Workload]:
    """Every Deployment's and Job's first container, with envFrom and valueFrom resolved
    from the rendered ConfigMaps and the example Secrets."""
    config_maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    secrets = example_secrets()
    workloads = []
    for doc in docs:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                data = config_maps[source["configMapRef"]["name"]]
            else:
                data = secrets[source["secretRef"]["name"]]
            env.update({k: v for k, v in data.items() if re.fullmatch(r"[A-Z_][A-Z0-9_]*", k)})
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
            else:
                ref = item["valueFrom"]["secretKeyRef"]
                env[item["name"]] = secrets[ref["name"]][ref["key"]]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        mounts = []
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                data = config_maps[volume["configMap"]["name"]]
                items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
                files = {i["path"]: data[i["key"]] for i in items}
                mounts.append(Mount(mount["mountPath"], "config", files))
            elif "persistentVolumeClaim" in volume:
                mounts.append(Mount(mount["mountPath"], "models"))
            else:
                mounts.append(Mount(mount["mountPath"], "scratch"))
        probes = {
            kind: container[kind]
            for kind in ("livenessProbe", "readinessProbe", "startupProbe")
            if kind in container
        }
        workloads.append(
            Workload(
                doc["metadata"]["name"],
                list(container.get("command", [])) + list(container.get("args", [])),
                env,
                mounts,
                probes,
                doc["kind"],
                {p["name"]: p["containerPort"] for p in container.get("ports", [])},
            )
        )
    return workloads


def _interpolate(text: str, variables: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}."""

    def one(match: re.Match) -> str:
        name, op, rest = match.group(1), match.group(2), match.group(3)
        value = variables.get(name, "")
        if op == ":-" and not value:
            return rest
        if op == ":?" and not value:
            raise KeyError(f"compose needs {name}: {rest}")
        return value

    return re.sub(r"\$\{([A-Z_][A-Z0-9_]*)(?:(:-|:\?)([^}]*))?\}", one, text)


def compose_workloads(variables: dict[str, str]) -> list[Workload]:
    """Every compose service built from deploy/Dockerfile (diffq's own roles)."""
    text = _interpolate((DEPLOY / "compose.yaml").read_text(), variables)
    services = yaml.safe_load(text)["services"]
    workloads = []
    for name, service in services.items():
        if "build" not in service:
            continue
        mounts = []
        for volume in service.get("volumes", []):
            source, inside = volume.split(":")[:2]
            if source.startswith("./") or source.startswith("/"):
                local = (DEPLOY / source).resolve()
                if local.is_file():
                    mounts.append(Mount(inside, "file", {Path(inside).name: local.read_text()}))
                else:
                    mounts.append(Mount(inside, "models"))
        command = service.get("command")
        if command is None:
            raise AssertionError(f"compose service {name} has no command")
        workloads.append(
            Workload(
                name,
                list(command),
                {k: str(v) for k, v in (service.get("environment") or {}).items()},
                mounts,
                {"healthcheck": service["healthcheck"]} if "healthcheck" in service else {},
                "service",
            )
        )
    return workloads


# --- making them local -----------------------------------------------------------------


def localize(
    workload: Workload, workdir: Path, models_dir: Path, secrets: dict[str, str]
) -> LocalRole:
    base = workdir / workload.name
    paths: dict[str, Path] = {}
    for private in PRIVATE_PATHS:
        paths[private] = base / private.strip("/").replace("/", "_")
        paths[private].mkdir(parents=True, exist_ok=True)
    for mount in workload.mounts:
        if mount.kind == "models":
            paths[mount.path] = models_dir
        elif mount.kind == "file":
            paths[mount.path] = base / "files" / Path(mount.path).name
        else:
            paths[mount.path] = base / mount.path.strip("/").replace("/", "_")
            paths[mount.path].mkdir(parents=True, exist_ok=True)
    ports = {port: free_port() for port in LISTEN_PORTS}
    role = LocalRole(workload, [], {}, ports, paths)
    for mount in workload.mounts:  # config files: their own paths made local too
        for name, content in mount.files.items():
            target = paths[mount.path] if mount.kind == "file" else paths[mount.path] / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(role.local_path(content))
    command = [role.local_text(arg) for arg in workload.command]
    if command and command[0] == "diffq":
        # This interpreter, as it is: its path is ours, not the container's to map (it
        # may itself lie under /tmp).
        command = [sys.executable, "-m", "cli", *command[1:]]
    role.args = command
    env = {name: role.local_text(value) for name, value in workload.env.items()}
    env.update({k: v for k, v in secrets.items() if k in env})
    path = os.environ.get("PATH", "/usr/bin:/bin")
    if "--gpus" in command:
        # A GPU node's driver, stood in: nvidia-smi lists the one GPU the container was
        # given. torch finds no CUDA here, so the pinned worker runs on the CPU.
        driver = paths["/tmp"] / "nvidia-driver"
        driver.mkdir(parents=True, exist_ok=True)
        smi = driver / "nvidia-smi"
        smi.write_text('#!/bin/sh\nprintf "GPU 0: NVIDIA Stand-in (UUID: GPU-0)\\n"\n')
        smi.chmod(0o755)
        path = f"{driver}:{path}"
    role.env = {
        "PATH": path,
        "HOME": str(paths["/var/lib/diffq"]),
        "LANG": "C.UTF-8",
        "TMPDIR": str(paths["/tmp"]),
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",  # the worker image's setting (deploy/Dockerfile)
        **env,
    }
    return role
