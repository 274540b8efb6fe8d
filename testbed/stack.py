"""A private diffq stack on the real services: database, vhost, S3 server, tiny models.

Used by the test session (tests/conftest.py) and by the benchmarks in bench/.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from testbed import services
from testbed.seaweed import SeaweedS3
from testbed.services import broker_connection

MODELS_TOML = """\
default_model = "tiny"

[models.tiny]
path = "{tiny}"
queue = "gpu.tiny"
dtype = "float32"
max_width = 256
max_height = 256
max_pixels = 49152
default_width = 64
default_height = 64
max_steps = 500
default_steps = 4
max_num_images = 3
max_prompt_chars = 300
soft_time_limit = 60
time_limit = 90
lora_family = "tiny"
max_loras = 2

[models.tiny-b]
path = "{tiny}"
queue = "gpu.tiny-b"
dtype = "float32"
max_width = 128
max_height = 128
max_pixels = 8192
default_width = 64
default_height = 64
max_steps = 10
default_steps = 2
max_num_images = 2
max_guidance = 12.0
schedulers = ["default", "euler"]
kinds = ["txt2img"]
quality = ["exact", "fast"]
soft_time_limit = 60
time_limit = 90

[models.tiny-b.tiers.fast]
guidance_until = 0.75
psnr = 41.5

[models.tiny-video]
path = "{tiny_video}"
queue = "gpu.tiny-video"
family = "ltx"
dtype = "float32"
min_size = 32
max_width = 128
max_height = 128
max_pixels = 16384
default_width = 64
default_height = 64
max_steps = 20
default_steps = 2
default_frames = 9
max_frames = 25
soft_time_limit = 60
time_limit = 90

[adapters.ink]
path = "{adapter}"
family = "tiny"

# Built when a test first needs it (build_tiny_controlnet below).
[controlnets.tiny-canny]
path = "{controlnet}"
family = "tiny"

# Never loaded: requests that name it for the tiny model are refused.
[controlnets.sdxl-canny]
path = "{controlnet}-sdxl"
family = "sdxl"
"""

QUEUES = ["gpu.tiny", "gpu.tiny-b", "gpu.tiny-video"]


@dataclass
class Stack:
    env: dict[str, str]
    workdir: Path
    logs: Path
    database_url: str
    broker_url: str
    bucket: str
    s3: SeaweedS3
    tiny_model: Path
    _cleanup: list = field(default_factory=list)

    def close(self) -> None:
        for step in reversed(self._cleanup):
            step()


# A folder shared by every process of one test run (tests/conftest.py sets it): each tiny
# model is built there once, by `diffq model build-tiny`, and copied where a stack wants
# it. Its weights are fixed by the seed, so the copy is the bytes a build writes; each
# build is a process that spends about 6 s of CPU importing torch and diffusers.
MODEL_CACHE_ENV = "DIFFQ_TEST_MODEL_CACHE"


def build_tiny_model(path: Path, family: str = "sd") -> Path:
    return _cached(path, family, ["build-tiny", "--family", family])


def _cached(path: Path, name: str, command: list[str]) -> Path:
    cache = os.environ.get(MODEL_CACHE_ENV)
    if not cache:
        return _build(path, command)
    built = Path(cache) / name
    with open(Path(cache) / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds; the others wait, then copy
        if not built.exists():
            partial = Path(cache) / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)  # a build killed half-way
            _build(partial, command).rename(built)
    shutil.copytree(built, path)
    return path


def _build(path: Path, command: list[str]) -> Path:
    subprocess.run(
        [sys.executable, "-m", "cli", "model", *command, str(path)],
        check=True,
        capture_output=True,
    )
    return path


def build_tiny_flux_controlnet(path: Path) -> Path:
    """A tiny FLUX ControlNet (add-on family `tiny-flux`) at `path`, built once a run."""
    return _cached(path, "controlnet-flux", ["build-tiny-controlnet", "--family", "flux"])


def build_tiny_controlnet(stack: Stack) -> Path:
    """The models file's `tiny-canny` ControlNet, built when a test first needs it."""
    path = stack.workdir / "models" / "tiny-controlnet"
    if not path.exists():
        _cached(path, "controlnet", ["build-tiny-controlnet"])
    return path


def build_tiny_video_model(stack: Stack) -> Path:
    """The models file's `tiny-video` (a tiny LTX-Video), built when a test first needs it."""
    path = stack.workdir / "models" / "tiny-video"
    if not path.exists():
        build_tiny_model(path, family="ltx")
    return path


def start_stack(workdir: Path, extra_env: dict[str, str] | None = None) -> Stack:
    """Everything a diffq process needs, private to this run; `close()` removes it all."""
    run = uuid.uuid4().hex[:10]
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    tiny = build_tiny_model(workdir / "models" / "tiny")
    models_file = workdir / "models.toml"
    from workers.tiny import build_tiny_lora

    adapter = workdir / "models" / "ink.safetensors"
    adapter.write_bytes(build_tiny_lora(seed=11))
    tiny_video = workdir / "models" / "tiny-video"  # built by build_tiny_video_model
    controlnet = workdir / "models" / "tiny-controlnet"  # built by build_tiny_controlnet
    models_file.write_text(
        MODELS_TOML.format(tiny=tiny, adapter=adapter, tiny_video=tiny_video, controlnet=controlnet)
    )
    cleanup: list = []
    try:
        db_name = f"diffq_test_{run}"
        database_url = services.create_database(db_name)
        cleanup.append(lambda: services.drop_database(db_name))
        vhost = f"diffq-test-{run}"
        broker_url = services.create_vhost(vhost)
        cleanup.append(lambda: services.delete_vhost(vhost))
        s3 = SeaweedS3(workdir / "s3").start()
        cleanup.append(s3.stop)
        bucket = f"diffq-test-{run}"
        s3.client().create_bucket(Bucket=bucket)

        from app.broker.topology import declare_topology
        from app.db.migrate import upgrade

        upgrade(database_url)
        with broker_connection(broker_url) as conn:
            declare_topology(conn, QUEUES)
    except BaseException:
        for step in reversed(cleanup):
            step()
        raise
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DIFFQ_")},
        # One torch thread per process: the suite runs several model processes on few
        # cores, where OpenMP threads spinning against each other cost 10-30x.
        "OMP_NUM_THREADS": "1",
        "DIFFQ_HOME": str(workdir / "home"),
        "DIFFQ_DATABASE_URL": database_url,
        "DIFFQ_BROKER_URL": broker_url,
        "DIFFQ_MODELS_FILE": str(models_file),
        "DIFFQ_PROGRESS_INTERVAL": "0.05",
        "DIFFQ_UPLOAD_BACKOFF": "0.1",
        "DIFFQ_UPLOAD_BACKOFF_MAX": "0.5",
        "DIFFQ_LOG_LEVEL": "INFO",
        "DIFFQ_SSE_KEEPALIVE": "1",
        "DIFFQ_WORKER_METRICS_PORT": "0",  # tests that read worker metrics pick a port
        "DIFFQ_RATE_LIMIT": "0",  # tests poll hard; test_limits.py sets its own
        # Tests fail authentication on purpose, and read gauges right after a change;
        # tests/security sets its own limits and cache.
        "DIFFQ_AUTH_FAILURES": "0",
        "DIFFQ_METRICS_CACHE_TTL": "0",
        **s3.env(bucket),
        **(extra_env or {}),
    }
    return Stack(env, workdir, logs, database_url, broker_url, bucket, s3, tiny, cleanup)
