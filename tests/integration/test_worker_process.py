"""Worker processes: a model that cannot load stops them loudly; a stop stops them all."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from testbed.processes import start_worker
from testbed.waiting import wait_until

pytestmark = pytest.mark.services

BROKEN = """\
[models.broken]
path = "{path}"
queue = "gpu.broken"
dtype = "float32"
"""


def _worker_env(stack, tmp_path, model_dir) -> dict[str, str]:
    models = tmp_path / "models.toml"
    models.write_text(BROKEN.format(path=model_dir))
    return {**stack.env, "DIFFQ_MODELS_FILE": str(models)}


def test_a_missing_model_directory_stops_the_worker_before_it_consumes(stack, tmp_path):
    env = _worker_env(stack, tmp_path, tmp_path / "nowhere")
    worker = start_worker(env, tmp_path, "worker-missing", wait=False)
    assert worker.process.wait(timeout=60) != 0
    assert "worker cannot start: model 'broken'" in worker.log()
    assert "is not a directory" in worker.log()
    assert "ready." not in worker.log()


def test_weights_that_fail_to_load_stop_the_worker(stack, tmp_path):
    model_dir = tmp_path / "corrupt"
    for name in ("unet", "vae", "text_encoder", "tokenizer", "scheduler"):
        (model_dir / name).mkdir(parents=True)
    (model_dir / "model_index.json").write_text(
        json.dumps(
            {
                "_class_name": "StableDiffusionPipeline",
                "unet": ["diffusers", "UNet2DConditionModel"],
                "vae": ["diffusers", "AutoencoderKL"],
                "text_encoder": ["transformers", "CLIPTextModel"],
                "tokenizer": ["transformers", "CLIPTokenizer"],
                "scheduler": ["diffusers", "DDIMScheduler"],
                "safety_checker": [None, None],
                "feature_extractor": [None, None],
            }
        )
    )
    env = _worker_env(stack, tmp_path, model_dir)
    worker = start_worker(env, tmp_path, "worker-corrupt", wait=False)
    assert worker.process.wait(timeout=120) != 0
    assert "model load failed; stopping the worker" in worker.log()
    assert "failed to load from" in worker.log()


def _stat(pid: int | str) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state, ppid, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def test_ctrl_c_to_the_whole_group_stops_every_worker_process(stack, tmp_path):
    worker = start_worker(stack.env, tmp_path, "worker-ctrl-c", models="tiny")
    processes = _descendants(worker.pid)
    assert len(processes) >= 2  # the Celery main process and its pool child
    # What a terminal does on Ctrl-C: SIGINT to every process of the foreground group.
    os.killpg(worker.pid, signal.SIGINT)
    assert worker.process.wait(timeout=60) == 0
    wait_until(lambda: not any(_alive(pid) for pid in processes), timeout=30)
    assert "Warm shutdown" in worker.log()
