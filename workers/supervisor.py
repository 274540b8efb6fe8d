"""`diffq worker`: one pinned Celery worker process per GPU (or one on the CPU).

Each Celery worker runs in its own session, so that a terminal's Ctrl-C or a signal to
this process group reaches it only through this supervisor, once, in order: SIGTERM
first (warm shutdown: the running job finishes or goes back to the queue), SIGQUIT on a
second signal or after the grace period, SIGKILL to the whole group as a last resort.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from app.catalog import Catalog
from app.config import load_settings
from app.metrics import multiproc
from workers import metrics as worker_metrics

log = logging.getLogger(__name__)

KILL_AFTER_QUIT_SECONDS = 30.0


def worker_command(
    name: str, queues: Sequence[str], loglevel: str, *, pool: str = "prefork", concurrency: int = 1
) -> list[str]:
    """A GPU worker: prefork, one pool process. (Webhook delivery: threads, many.)"""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tasks",
        "worker",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        f"--queues={','.join(queues)}",
        f"--hostname={name}@%h",
        f"--loglevel={loglevel}",
        "--without-mingle",
        "--without-gossip",
    ]


def queues_for(
    catalog: Catalog, models: Sequence[str] | None, queues: Sequence[str] | None = None
) -> list[str]:
    """The queues of the chosen models (each model's high-priority queue included), or
    exactly `queues` (a spot pool takes `gpu.sdxl`, an on-demand pool `gpu.sdxl.high`)."""
    if queues:
        unknown = sorted(set(queues) - set(catalog.queues))
        if unknown:
            raise ValueError(f"unknown queue(s) {unknown}; configured: {catalog.queues}")
        return sorted(set(queues))
    if not models:
        return catalog.queues
    unknown = [m for m in models if m not in catalog.models]
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; configured: {sorted(catalog.models)}")
    return sorted({q for m in models for q in catalog.models[m].all_queues})


class ProcessGroup:
    """Children started in their own sessions, stopped with escalating signals."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen] = []
        self.stop_requested_at: float | None = None
        self._escalation = 0

    def start(self, args: list[str], **kwargs) -> subprocess.Popen:
        child = subprocess.Popen(args, start_new_session=True, **kwargs)
        self.children.append(child)
        return child

    def alive(self) -> list[subprocess.Popen]:
        return [child for child in self.children if child.poll() is None]

    def _signal_all(self, signum: int, *, group: bool = False) -> None:
        for child in self.alive():
            try:
                if group:
                    os.killpg(child.pid, signum)
                else:
                    child.send_signal(signum)
            except ProcessLookupError:
                pass

    def request_stop(self) -> None:
        """First call: SIGTERM. Each further call escalates: SIGQUIT, then SIGKILL."""
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
        steps = (
            (signal.SIGTERM, False),
            (signal.SIGQUIT, False),
            (signal.SIGKILL, True),
        )
        signum, group = steps[min(self._escalation, len(steps) - 1)]
        self._escalation += 1
        self._signal_all(signum, group=group)

    def escalate_if_overdue(self, grace: float) -> None:
        """Called while stopping: move up a step when the previous one took too long."""
        if self.stop_requested_at is None:
            return
        waited = time.monotonic() - self.stop_requested_at
        due = {1: grace, 2: grace + KILL_AFTER_QUIT_SECONDS}.get(self._escalation)
        if due is not None and waited > due:
            log.warning("children still running %.0fs after the stop request; escalating", waited)
            self.request_stop()


def run_workers(
    gpus: Sequence[str],
    queues: Sequence[str],
    loglevel: str = "info",
    name: str | None = None,
    grace: float = 700.0,
) -> int:
    """Start the workers, relay stop signals, and exit when any of them exits.

    One worker stopping takes the others down with it and its exit status is returned,
    so that a model that fails to load is seen by whatever supervises this process.
    `grace` bounds a warm shutdown (default: longer than the default hard time limit).
    """
    plan = [(f"{name or 'gpu'}{gpu}", gpu) for gpu in gpus] or [(name or "cpu", "")]
    group = ProcessGroup()
    settings = load_settings()
    metrics_port = settings.worker_metrics_port
    for index, (node, gpu) in enumerate(plan):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
        if metrics_port > 0:
            # Each GPU's worker serves its own /metrics on the next port, summing the
            # files its pool processes write to its own (emptied) folder.
            env["DIFFQ_WORKER_METRICS_PORT"] = str(metrics_port + index)
            folder = worker_metrics.directory(settings, node)
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True, exist_ok=True)
            env[multiproc.ENV] = str(folder)
        where = f"GPU {gpu}" if gpu else "CPU"
        log.info("starting worker %s on %s for queues %s", node, where, ",".join(queues))
        group.start(worker_command(node, queues, loglevel), env=env)

    def on_signal(_signum, _frame) -> None:
        group.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    status = 0
    while True:
        for child in group.children:
            code = child.poll()
            if code is not None and group.stop_requested_at is None:
                # Exiting unasked is a failure even with status 0 (Celery's WorkerShutdown).
                log.error("worker pid %d exited with %s; stopping the others", child.pid, code)
                status = code or 1
                group.request_stop()
        if not group.alive():
            return status
        group.escalate_if_overdue(grace)
        time.sleep(0.2)
