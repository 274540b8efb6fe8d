"""`diffq up` serves a job to completion with no RabbitMQ, PostgreSQL or S3."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import requests
from PIL import Image

from app.catalog import tiny_spec
from testbed.jobs import auth, submit, wait_terminal
from testbed.ports import free_port


def _clean_env(home) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DIFFQ_", "AWS_")) and k not in ("PYTHONPATH",)
    }
    env["HOME"] = str(home)
    # Any attempt to reach a server would fail here, not silently find the shared ones.
    env["PGHOST"] = "127.0.0.1"
    env["PGPORT"] = "1"
    return env


def _wait_banner(process: subprocess.Popen, log_path, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        if "diffq is up" in text:
            return text
        if process.poll() is not None:
            raise AssertionError(f"diffq up exited {process.returncode}:\n{text[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"no banner after {timeout}s:\n{log_path.read_text()[-3000:]}")


def _largest_size_finishes_inside_its_limit(url: str, key: str, spec) -> None:
    """The page offers every size the embedded catalog accepts: the largest must finish."""
    job = submit(url, key, prompt="the largest size", width=spec.max_width, height=spec.max_height)
    done = wait_terminal(url, key, job["id"], timeout=spec.time_limit + 30)
    run = done["metrics"]["run_seconds"]
    print(
        f"embedded {spec.max_width}x{spec.max_height} at {done['input']['steps']} steps: "
        f"{done['status']} in {run} s (soft limit {spec.soft_time_limit} s)"
    )
    assert done["status"] == "succeeded", done
    assert done["input"]["steps"] == spec.default_steps
    assert done["result"]["images"][0]["width"] == spec.max_width


def test_diffq_up_runs_a_job_end_to_end_without_servers(tmp_path):
    port = free_port()
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli", "up", "--bind", f"127.0.0.1:{port}"],
            env=_clean_env(tmp_path),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        banner = _wait_banner(process, log_path)
        key = re.search(r"API key\s+(dq_\S+)", banner).group(1)
        url = f"http://127.0.0.1:{port}"
        job = submit(url, key, prompt="a lantern", width=96, height=64, steps=3, seed=3)
        done = wait_terminal(url, key, job["id"], timeout=90)
        assert done["status"] == "succeeded", done
        # The banner is printed once the worker has its model: the job did not wait for it.
        assert done["metrics"]["queue_seconds"] < 4, done["metrics"]
        image_url = done["result"]["images"][0]["url"]
        assert image_url.startswith(f"{url}/files/") and "signature=" in image_url
        body = requests.get(image_url, timeout=10)
        assert body.status_code == 200
        assert Image.open(io.BytesIO(body.content)).size == (96, 64)
        assert requests.get(image_url.split("?")[0], timeout=10).status_code == 403
        redirect = requests.get(
            f"{url}/v1/jobs/{job['id']}/images/0", headers=auth(key), allow_redirects=False
        )
        assert redirect.status_code == 302
        home = tmp_path / ".diffq"
        _largest_size_finishes_inside_its_limit(url, key, tiny_spec(home / "models" / "tiny"))
        assert (home / "diffq.sqlite3").is_file()
        assert list((home / "images").rglob("0.png"))
        assert "amqp://" not in log_path.read_text()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            code = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    assert code == 0, log_path.read_text()[-3000:]


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
