"""The `diffq` client commands against a running API."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from PIL import Image

pytestmark = pytest.mark.services


def diffq(api_server, key, *args, timeout=120) -> subprocess.CompletedProcess:
    env = {"DIFFQ_URL": api_server.url, "DIFFQ_API_KEY": key, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_generate_shows_progress_and_saves_the_images(api_server, worker, tenant_key, tmp_path):
    out = tmp_path / "fox.png"
    result = diffq(
        api_server,
        tenant_key,
        "generate",
        "a red fox",
        "--steps",
        "30",
        "--width",
        "96",
        "--num-images",
        "2",
        "--seed",
        "5",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    saved = result.stdout.split()
    assert saved == [str(tmp_path / "fox-0.png"), str(tmp_path / "fox-1.png")]
    assert [Image.open(p).size for p in saved] == [(96, 64), (96, 64)]
    assert "denoising" in result.stderr and "[#" in result.stderr
    assert "/30" in result.stderr


def test_jobs_commands_speak_json_for_scripts(api_server, worker, tenant_key):
    submitted = diffq(api_server, tenant_key, "jobs", "submit", "a kite", "--steps", "2", "--json")
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]

    watched = diffq(api_server, tenant_key, "jobs", "watch", job_id, "--json")
    assert json.loads(watched.stdout)["status"] == "succeeded"
    got = json.loads(diffq(api_server, tenant_key, "jobs", "get", job_id, "--json").stdout)
    assert got["id"] == job_id and got["result"]["images"]
    listed = json.loads(diffq(api_server, tenant_key, "jobs", "list", "--json").stdout)
    assert job_id in [j["id"] for j in listed["data"]]

    refused = diffq(api_server, tenant_key, "jobs", "cancel", job_id)
    assert refused.returncode == 2 and "HTTP 409" in refused.stderr


def test_jobs_submit_wait_and_cancel(api_server, tenant_key):
    queued = diffq(
        api_server,
        tenant_key,
        "jobs",
        "submit",
        "later",
        "--model",
        "tiny-b",
        "--json",
        "--idempotency-key",
        "cli-key-1",
    )
    job_id = json.loads(queued.stdout)["id"]
    again = diffq(
        api_server,
        tenant_key,
        "jobs",
        "submit",
        "later",
        "--model",
        "tiny-b",
        "--json",
        "--idempotency-key",
        "cli-key-1",
    )
    assert json.loads(again.stdout)["id"] == job_id
    canceled = diffq(api_server, tenant_key, "jobs", "cancel", job_id)
    assert canceled.returncode == 0 and "canceled" in canceled.stdout


def test_bad_input_is_reported_plainly(api_server, tenant_key):
    result = diffq(api_server, tenant_key, "generate", "x", "--steps", "9999")
    assert result.returncode == 2
    assert "HTTP 422" in result.stderr and "steps" in result.stderr
    no_key = subprocess.run(
        [sys.executable, "-m", "cli", "jobs", "list", "--url", api_server.url],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert no_key.returncode == 2 and "API key" in no_key.stderr
