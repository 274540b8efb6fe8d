"""`diffq worker`: one worker per GPU, a crash costs only that GPU, repeated crashes stop all.

The workers here are stand-in processes (one short Python script per GPU) so that the
restart policy is tested in seconds; tests/integration/test_gpu_workers.py runs real Celery
workers under the same supervisor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testbed.waiting import wait_until
from workers.devices import NoGpus, parse_gpus

REPO = Path(__file__).resolve().parents[2]

# Each stand-in writes its pid and CUDA_VISIBLE_DEVICES, then sleeps; it exits at once with
# status 3 while a file named crash-<node> exists.
STAND_IN = textwrap.dedent(
    """
    import json, os, sys, time
    node, folder = sys.argv[1], sys.argv[2]
    with open(os.path.join(folder, "starts.jsonl"), "a") as out:
        out.write(json.dumps({"node": node, "pid": os.getpid(),
                              "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\\n")
    if os.path.exists(os.path.join(folder, "crash-" + node)):
        sys.exit(3)
    while True:
        time.sleep(0.2)
    """
)

SUPERVISOR = textwrap.dedent(
    """
    import sys
    from workers.supervisor import RestartPolicy, run_workers
    folder = sys.argv[1]
    script = folder + "/stand_in.py"
    policy = RestartPolicy(backoff=0.2, backoff_max=0.8, max_crashes=4, window=30)
    command = lambda node, queues, loglevel: [sys.executable, script, node, folder]
    sys.exit(run_workers(["0", "1"], ["gpu.tiny"], grace=5, policy=policy, command=command))
    """
)


def _starts(folder: Path) -> list[dict]:
    path = folder / "starts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_one_crash_restarts_only_that_gpu_and_repeated_crashes_stop_everything(tmp_path):
    (tmp_path / "stand_in.py").write_text(STAND_IN)
    env = {**os.environ, "PYTHONPATH": str(REPO), "DIFFQ_WORKER_METRICS_PORT": "0"}
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(tmp_path)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = wait_until(lambda: (s := _starts(tmp_path)) and len(s) == 2 and s, timeout=30)
        by_node = {s["node"]: s for s in first}
        # One worker per GPU, each pinned to its own device.
        assert {n: s["cuda"] for n, s in by_node.items()} == {"gpu0": "0", "gpu1": "1"}

        os.kill(by_node["gpu0"]["pid"], signal.SIGKILL)
        restarted = wait_until(lambda: len(_starts(tmp_path)) == 3 and _starts(tmp_path)[2])
        assert restarted["node"] == "gpu0" and restarted["cuda"] == "0"
        assert _alive(by_node["gpu1"]["pid"]), "the other GPU's worker was stopped"
        assert supervisor.poll() is None

        # Now gpu0 crashes at every start: after max_crashes in the window, all stop.
        (tmp_path / "crash-gpu0").touch()
        os.kill(restarted["pid"], signal.SIGKILL)
        code = supervisor.wait(timeout=60)
        output = supervisor.stdout.read()
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    gpu0_starts = [s for s in _starts(tmp_path) if s["node"] == "gpu0"]
    print(f"exit {code}; gpu0 started {len(gpu0_starts)} times")
    assert code == 3
    assert "4 crashes within 30s; stopping every worker" in output
    assert len(gpu0_starts) == 4  # first start, then a restart after each of 3 crashes
    assert [s for s in _starts(tmp_path) if s["node"] == "gpu1"] == [by_node["gpu1"]]
    assert not _alive(by_node["gpu1"]["pid"])


def _fake_nvidia_smi(folder: Path, gpus: int) -> Path:
    folder.mkdir()
    script = folder / "nvidia-smi"
    lines = "".join(f"GPU {i}: NVIDIA Fake (UUID: GPU-{i})\\n" for i in range(gpus))
    script.write_text(f'#!/bin/sh\nprintf "{lines}"\n')
    script.chmod(0o755)
    return folder


def test_gpus_all_lists_what_nvidia_smi_lists(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(_fake_nvidia_smi(tmp_path / "bin", 3)))
    assert parse_gpus("all") == ["0", "1", "2"]
    assert parse_gpus("auto") == ["0", "1", "2"]
    assert parse_gpus("0,2") == ["0", "2"]


def test_gpus_all_without_nvidia_smi_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NoGpus, match="nvidia-smi is not on the PATH"):
        parse_gpus("all")
    assert parse_gpus("auto") == []  # the explicit fallback to the CPU
    result = subprocess.run(
        [sys.executable, "-m", "cli", "worker", "--gpus", "all"],
        env={**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(REPO)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "nvidia-smi is not on the PATH" in result.stderr
    assert "celery" not in result.stderr.lower()  # no worker was started


def test_an_empty_gpu_list_is_an_error_too(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(_fake_nvidia_smi(tmp_path / "bin", 0)))
    with pytest.raises(NoGpus, match="lists no GPU"):
        parse_gpus("all")
