"""`diffq worker --gpus all` on a host with two (pretend) GPUs: one pinned Celery worker per
GPU; killing one costs only that GPU, which the supervisor brings back by itself."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from testbed.jobs import submit, wait_terminal
from testbed.processes import ManagedProcess
from testbed.waiting import wait_until

pytestmark = pytest.mark.services


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry))
    return found


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _workers_by_gpu(supervisor: int) -> dict[str, int]:
    return {_environ(pid).get("CUDA_VISIBLE_DEVICES", "?"): pid for pid in _children(supervisor)}


def test_one_worker_per_gpu_and_a_killed_one_comes_back_alone(stack, api_server, tenant_key):
    fake_bin = stack.workdir / "fake-nvidia"
    fake_bin.mkdir(exist_ok=True)
    smi = fake_bin / "nvidia-smi"
    listing = "GPU 0: NVIDIA Fake (UUID: GPU-a)\\nGPU 1: NVIDIA Fake (UUID: GPU-b)\\n"
    smi.write_text(f'#!/bin/sh\nprintf "{listing}"\n')
    smi.chmod(0o755)
    env = {**stack.env, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    args = [sys.executable, "-m", "cli", "worker", "--gpus", "all", "--models", "tiny-b"]
    workers = ManagedProcess("worker-pinned", [*args, "--name", "pinned"], env, stack.logs)
    workers.start()
    try:
        workers.wait_for_log(r"ready\.", timeout=180, count=2)
        before = _workers_by_gpu(workers.pid)
        assert sorted(before) == ["0", "1"], before  # one Celery worker per id, pinned

        os.killpg(before["0"], signal.SIGKILL)  # the worker on GPU 0 dies, pool child and all
        workers.wait_for_log(r"worker pinned0 \(GPU 0\) exited with .*restarting it in")
        workers.wait_for_log(r"ready\.", timeout=180, count=3)
        after = _workers_by_gpu(workers.pid)
        assert after["1"] == before["1"], "GPU 1's worker was restarted too"
        assert after["0"] != before["0"] and sorted(after) == ["0", "1"]

        jobs = [
            submit(api_server.url, tenant_key, prompt=f"pinned {i}", model="tiny-b", steps=2)
            for i in range(2)
        ]
        done = [wait_terminal(api_server.url, tenant_key, j["id"], timeout=120) for j in jobs]
        print(
            f"GPU 0 pid {before['0']} -> {after['0']}; GPU 1 pid {after['1']} kept; "
            f"{sum(j['status'] == 'succeeded' for j in done)}/{len(done)} jobs succeeded"
        )
        assert [j["status"] for j in done] == ["succeeded"] * len(jobs)
        assert workers.count(r"succeeded in") >= 1
        assert workers.count(r"stopping every worker") == 0
    finally:
        assert workers.stop(signal.SIGTERM, timeout=60) == 0
    wait_until(lambda: not _children(workers.pid), timeout=10)
