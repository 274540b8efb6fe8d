"""The fault suite's own stack: a private PostgreSQL cluster and RabbitMQ node on their own
ports (so they can be stopped, killed and restarted), SeaweedFS behind a cuttable proxy,
an API, a relay and two workers. Every scenario prints a line of figures; the whole table
is printed at the end of the run."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testbed.faultproxy import FaultProxy
from testbed.private_postgres import PrivatePostgres
from testbed.private_rabbit import PrivateRabbitMQ
from testbed.processes import ApiServer, ManagedProcess, start_worker
from testbed.receiver import Receiver
from testbed.seaweed import SeaweedS3
from testbed.stack import build_tiny_model

# The tiny model's shape and limits, shared by `tiny` and `tiny-long`. The limits leave
# room for N7's hung job run again from its start on a loaded 2-core machine with
# libfaketime preloaded. That job was 400 steps: 52 to 66 s for one uninterrupted run in
# a full run alone, past 150 s once on a machine three times slower, and past this limit
# once under CI's load; it is 150 steps now (tests/faults/test_clock_jump.py).
TINY = """\
path = "{tiny}"
dtype = "float32"
max_width = 128
max_height = 128
max_pixels = 16384
default_width = 64
default_height = 64
max_steps = 500
default_steps = 8
soft_time_limit = 300
time_limit = 330
"""

MODELS = (
    'default_model = "tiny"\n\n'
    '[models.tiny]\nqueue = "gpu.tiny"\n'
    + TINY
    # N7's long jobs: the tiny model on a queue only the worker whose clock jumps
    # consumes, so each long job runs there, and at once.
    + '\n[models.tiny-long]\nqueue = "gpu.tiny-long"\n'
    + TINY
    + """
[models.tiny-slow]
path = "{tiny}"
queue = "gpu.tiny"
dtype = "float32"
default_width = 64
default_height = 64
max_steps = 500
default_steps = 8
soft_time_limit = 2
time_limit = 5

[models.tiny-batch]
path = "{tiny}"
queue = "gpu.tiny-batch"
dtype = "float32"
max_width = 128
max_height = 128
max_pixels = 16384
default_width = 64
default_height = 64
max_steps = 500
default_steps = 8
soft_time_limit = 60
time_limit = 90
max_batch = 4
max_wait_ms = 300

# A tiny LTX-Video (workers/tiny_video.py), built only when a video scenario first needs
# it (FaultStack.start_video_worker); clips of up to 25 frames, with enough steps that a
# kill lands mid-denoising, and checkpoints several times a second.
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
max_steps = 500
default_steps = 2
default_frames = 9
max_frames = 25
checkpoint_seconds = 0.2
soft_time_limit = 150
time_limit = 180
"""
)

WORKERS = ("fa", "fb")


@dataclass
class FaultStack:
    env: dict[str, str]
    logs: Path
    rabbit: PrivateRabbitMQ
    pg: PrivatePostgres
    s3: SeaweedS3
    proxy: FaultProxy
    bucket: str
    db: object
    api: ApiServer
    relay: ManagedProcess | None = None
    workers: dict[str, ManagedProcess] = field(default_factory=dict)
    # Every scenario's jobs carry a webhook to this receiver: what a client sees.
    receiver: Receiver | None = None
    deliverer: ManagedProcess | None = None

    def worker_logs(self) -> list[Path]:
        return sorted(self.logs.glob("worker-*.log"))

    def objects_of(self, row) -> list[str]:
        listing = self.s3.client().list_objects_v2(
            Bucket=self.bucket, Prefix=f"{row.tenant_id}/{row.id}/"
        )
        return [item["Key"] for item in listing.get("Contents", [])]

    def start_worker(
        self,
        name: str,
        extra_env: dict[str, str] | None = None,
        models: str = "tiny,tiny-slow,tiny-batch",
    ) -> ManagedProcess:
        env = {**self.env, **(extra_env or {})}
        worker = start_worker(env, self.logs, f"worker-{name}", models=models)
        self.workers[name] = worker
        return worker

    def start_video_worker(
        self, name: str = "video", extra_env: dict[str, str] | None = None
    ) -> ManagedProcess:
        """A worker serving `tiny-video` alone, its model built on first use (only the
        video scenarios need it); stop it with `stop_workers([name])`."""
        path = self.logs.parent / "models" / "tiny-video"
        if not path.exists():
            build_tiny_model(path, family="ltx")
        env = {**self.env, **(extra_env or {})}
        worker = start_worker(env, self.logs, f"worker-{name}", models="tiny-video")
        self.workers[name] = worker
        return worker

    def restart_killed_worker(self, supervisor: int | None) -> None:
        """After a Celery main process was killed, its supervisor (`diffq worker`) starts
        it again by itself: wait until the new one consumes."""
        for worker in self.workers.values():
            if worker.pid == supervisor:
                worker.wait_for_log(r"restarting it in", timeout=30)
                restarts = worker.count(r"restarting it in")
                worker.wait_for_log(r"ready\.", timeout=180, count=restarts + 1)

    def ensure_workers(self, names=WORKERS) -> None:
        for name in names:
            worker = self.workers.get(name)
            if worker is None or worker.process.poll() is not None:
                self.start_worker(name)

    def stop_workers(self, names=WORKERS) -> None:
        for name in names:
            worker = self.workers.pop(name, None)
            if worker is not None:
                worker.stop(signal.SIGTERM, timeout=60)

    def start_relay(self) -> None:
        self.relay = ManagedProcess(
            "relay",
            [sys.executable, "-m", "cli", "relay", "--interval", "0.5"],
            self.env,
            self.logs,
        ).start()

    def start_deliverer(self) -> None:
        self.deliverer = ManagedProcess(
            "webhooks",
            [
                sys.executable,
                "-m",
                "cli",
                "webhooks",
                "--concurrency",
                "4",
                "--metrics-port",
                "0",
            ],
            {**self.env, "DIFFQ_METRICS_DIR": str(self.logs.parent / "metrics-hooks")},
            self.logs,
        ).start()

    def stop_relay(self) -> None:
        if self.relay is not None:
            self.relay.stop()
            self.relay = None

    def new_key(self) -> str:
        from app.keys import create_key, get_or_create_tenant

        with self.db.session() as session:
            tenant = get_or_create_tenant(session, f"fault-{uuid.uuid4().hex[:10]}")
            return create_key(session, tenant, "faults")


SCENARIO_DEADLINE = 1200  # seconds: a scenario's own waits add up to several minutes


def pytest_collection_modifyitems(items) -> None:
    """A fault scenario's deadline (pytest-timeout) is longer than the suite's: its steady
    load, its settle and its recovery waits each have their own limits inside it."""
    for item in items:
        if item.nodeid.startswith("tests/faults/") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SCENARIO_DEADLINE))


@pytest.fixture(scope="session")
def fault_stack(tmp_path_factory) -> FaultStack:
    workdir = tmp_path_factory.mktemp("faults")
    logs = workdir / "logs"
    logs.mkdir()
    # Each part is stopped in reverse order at the end, or at once if the setup fails
    # half-way (run 65: a failed first attempt left its PostgreSQL and S3 running).
    parts = contextlib.ExitStack()
    try:
        stack = _start_fault_stack(workdir, logs, parts)
    except BaseException:
        parts.close()
        raise
    with parts:
        yield stack


def _start_fault_stack(workdir: Path, logs: Path, parts: contextlib.ExitStack) -> FaultStack:
    from app.broker.topology import declare_topology
    from app.db.migrate import upgrade
    from app.db.session import Database
    from testbed.services import broker_connection

    rabbit = PrivateRabbitMQ(workdir / "rabbit")
    # The node takes the longest to boot: start it while the rest is set up.
    booting = threading.Thread(target=rabbit.start)
    booting.start()
    parts.callback(rabbit.close)
    parts.callback(booting.join)  # a boot still under way ends before the node is stopped
    pg = PrivatePostgres().init()
    parts.callback(pg.close)
    pg.start()
    s3 = SeaweedS3(workdir / "s3").start()
    parts.callback(s3.stop)
    proxy = FaultProxy(s3.port).start()
    parts.callback(proxy.stop)
    bucket = f"faults-{uuid.uuid4().hex[:8]}"
    s3.client().create_bucket(Bucket=bucket)
    tiny = build_tiny_model(workdir / "models" / "tiny")
    tiny_video = workdir / "models" / "tiny-video"  # built by start_video_worker
    (workdir / "models.toml").write_text(MODELS.format(tiny=tiny, tiny_video=tiny_video))
    database_url = pg.create_database("diffq")
    upgrade(database_url)
    booting.join()
    broker_url = rabbit.url
    with broker_connection(broker_url) as conn:
        declare_topology(conn, ["gpu.tiny", "gpu.tiny-batch", "gpu.tiny-video"])
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DIFFQ_")},
        "DIFFQ_HOME": str(workdir / "home"),
        "DIFFQ_DATABASE_URL": database_url,
        "DIFFQ_BROKER_URL": broker_url,
        "DIFFQ_MODELS_FILE": str(workdir / "models.toml"),
        **s3.env(bucket),
        # Workers reach S3 through the proxy; the API signs URLs for S3 itself.
        "DIFFQ_S3_PUBLIC_ENDPOINT_URL": s3.endpoint,
        "DIFFQ_PROGRESS_INTERVAL": "0.1",
        "DIFFQ_LEASE_SECONDS": "10",  # renewed every 3.3 s: a loaded 2-core host can lag 6
        "DIFFQ_SHUTDOWN_GRACE": "3",
        "DIFFQ_MAX_ATTEMPTS": "3",
        "DIFFQ_RELAY_AFTER": "1",
        "DIFFQ_UPLOAD_RETRIES": "6",
        "DIFFQ_UPLOAD_BACKOFF": "0.5",
        "DIFFQ_UPLOAD_BACKOFF_MAX": "4",
        "DIFFQ_DB_RETRY": "60",
        "DIFFQ_WORKER_METRICS_PORT": "0",  # tests that read worker metrics pick a port
        "DIFFQ_RATE_LIMIT": "0",  # tests poll hard; test_limits.py sets its own
        "DIFFQ_WEBHOOK_ALLOW_CIDRS": "127.0.0.1/32",  # the receiver on loopback
        "DIFFQ_WEBHOOK_SCHEDULE": "0.5,1,1,2,2,4",
        "DIFFQ_WEBHOOK_TIMEOUT": "5",
        # Two CPU workers share two cores: spinning OpenMP threads would thrash.
        "OMP_NUM_THREADS": "1",
    }
    api = ApiServer(env, logs, name="api-faults").start()
    parts.callback(api.stop)
    env["DIFFQ_S3_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.port}"
    stack = FaultStack(
        env=env,
        logs=logs,
        rabbit=rabbit,
        pg=pg,
        s3=s3,
        proxy=proxy,
        bucket=bucket,
        db=Database(database_url, pool_size=2),
        api=api,
    )
    parts.callback(lambda: stack.db.dispose())
    stack.receiver = Receiver().start()
    parts.callback(lambda: stack.receiver.stop())
    stack.start_relay()
    parts.callback(stack.stop_relay)
    stack.start_deliverer()
    parts.callback(lambda: stack.deliverer.stop())
    parts.callback(lambda: stack.stop_workers(list(stack.workers)))
    stack.ensure_workers()
    return stack


@pytest.fixture(autouse=True)
def quiet_queue(fault_stack) -> None:
    """Each scenario starts on an idle stack, so one's backlog never skews the next."""
    from sqlalchemy import func, select

    from app.db.models.jobs import Job
    from app.jobs.states import JobStatus

    fault_stack.ensure_workers()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        with fault_stack.db.session() as session:
            busy = session.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))
            )
        if not busy:
            return
        time.sleep(0.5)
    pytest.fail(f"{busy} jobs still queued or running from an earlier scenario")
