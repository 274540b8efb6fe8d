"""`diffq worker`: one pinned Celery worker process per GPU (or one on the CPU).

Each Celery worker runs in its own session, so that a terminal's Ctrl-C or a signal to
this process group reaches it only through this supervisor, once, in order: SIGTERM
first (warm shutdown: the running job finishes or goes back to the queue), SIGQUIT on a
second signal or after the grace period, SIGKILL to the whole group as a last resort.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.catalog import Catalog
from app.config import Settings, load_settings
from app.metrics import multiproc
from workers import metrics as worker_metrics

# sysexits EX_CONFIG: what `diffq worker` returns when a worker's models cannot load.
EXIT_MODEL_LOAD = 78
# tasks/boot/common.py writes its reason here when no restart can cure it (same name there).
FATAL_MARKER_ENV = "DIFFQ_WORKER_FATAL_FILE"

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


@dataclass(frozen=True)
class RestartPolicy:
    """How a crashed GPU worker comes back: alone, after a growing pause, a few times.

    A worker that exits unasked is restarted after `backoff` seconds, doubling up to
    `backoff_max` while it keeps crashing (a run longer than `stable_seconds` starts the
    pause again from `backoff`). `max_crashes` crashes of one worker within `window`
    seconds mean something is wrong beyond one job: everything stops and `diffq worker`
    exits non-zero, so the host's supervisor (systemd, Kubernetes) sees it.
    """

    backoff: float = 1.0
    backoff_max: float = 60.0
    stable_seconds: float = 300.0
    max_crashes: int = 5
    window: float = 600.0


@dataclass
class Slot:
    """One GPU (or the CPU) and the Celery worker currently pinned to it."""

    node: str
    gpu: str
    env: dict[str, str]
    child: subprocess.Popen | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    pause: float = 0.0
    crashes: deque = field(default_factory=deque)

    @property
    def marker(self) -> Path:
        return Path(self.env[FATAL_MARKER_ENV])

    def fatal_reason(self) -> str | None:
        try:
            return self.marker.read_text() or "unknown"
        except OSError:
            return None

    @property
    def where(self) -> str:
        return f"GPU {self.gpu}" if self.gpu else "CPU"


def _slot_env(settings, node: str, gpu: str, index: int) -> dict[str, str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
    metrics_port = settings.worker_metrics_port
    if metrics_port > 0:
        # Each GPU's worker serves its own /metrics on the next port, summing the
        # files its pool processes write to its own (emptied) folder.
        env["DIFFQ_WORKER_METRICS_PORT"] = str(metrics_port + index)
        folder = worker_metrics.directory(settings, node)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        env[multiproc.ENV] = str(folder)
    return env


def _reap_group(pid: int) -> None:
    """A Celery main process that died may leave its pool child (and the GPU memory it
    holds) behind in its process group: end it before the GPU gets a new worker."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_workers(
    gpus: Sequence[str],
    queues: Sequence[str],
    loglevel: str = "info",
    name: str | None = None,
    grace: float = 700.0,
    policy: RestartPolicy | None = None,
    command: Callable[[str, Sequence[str], str], list[str]] = worker_command,
    settings: Settings | None = None,
) -> int:
    """Start one worker per GPU, restart each alone when it crashes, relay stop signals.

    Returns 0 after a requested stop; non-zero when a worker cannot start (its models
    cannot load: exit status 78, everything stopped at once, every GPU would fail alike)
    or crashed `policy.max_crashes` times within `policy.window` seconds.
    `grace` bounds a warm shutdown (default: longer than the default hard time limit).
    """
    policy = policy or RestartPolicy()
    plan = [(f"{name or 'gpu'}{gpu}", gpu) for gpu in gpus] or [(name or "cpu", "")]
    group = ProcessGroup()
    settings = settings or load_settings()  # `diffq worker` passes its root's
    markers = Path(tempfile.mkdtemp(prefix="diffq-worker-"))
    slots = [
        Slot(node, gpu, _slot_env(settings, node, gpu, index))
        for index, (node, gpu) in enumerate(plan)
    ]
    for slot in slots:
        slot.env[FATAL_MARKER_ENV] = str(markers / f"{slot.node}.fatal")
    try:
        return _supervise(slots, group, queues, loglevel, grace, policy, command)
    finally:
        shutil.rmtree(markers, ignore_errors=True)


def _supervise(slots, group, queues, loglevel, grace, policy, command) -> int:
    def start(slot: Slot) -> None:
        slot.marker.unlink(missing_ok=True)
        log.info("starting worker %s on %s for queues %s", slot.node, slot.where, ",".join(queues))
        slot.child = group.start(command(slot.node, queues, loglevel), env=slot.env)
        slot.started_at = time.monotonic()
        slot.restart_at = None

    for slot in slots:
        start(slot)

    def on_signal(_signum, _frame) -> None:
        group.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    status = 0
    while True:
        now = time.monotonic()
        for slot in slots:
            if group.stop_requested_at is not None:
                break
            if slot.restart_at is not None:
                if now >= slot.restart_at:
                    start(slot)
                continue
            code = slot.child.poll() if slot.child is not None else None
            if code is None:
                continue
            # Exiting unasked is a crash even with status 0 (Celery's WorkerShutdown).
            _reap_group(slot.child.pid)
            group.children.remove(slot.child)
            fatal = slot.fatal_reason()
            verdict = _after_crash(slot, now, policy) if fatal is None else None
            if fatal is not None or verdict is not None:
                why = verdict or f"it cannot start ({fatal}); stopping every worker"
                log.error("worker %s (%s) exited with %s; %s", slot.node, slot.where, code, why)
                status = EXIT_MODEL_LOAD if fatal is not None else (code or 1)
                group.request_stop()
                break
            log.error(
                "worker %s (%s) exited with %s; restarting it in %.1fs (crash %d in %.0fs), "
                "the other workers keep running",
                slot.node,
                slot.where,
                code,
                slot.pause,
                len(slot.crashes),
                policy.window,
            )
            slot.restart_at = now + slot.pause
        if group.stop_requested_at is not None and not group.alive():
            return status
        group.escalate_if_overdue(grace)
        time.sleep(0.2)


def _after_crash(slot: Slot, now: float, policy: RestartPolicy) -> str | None:
    """Record a crash and set the pause before the restart; a reason to give up, or None."""
    slot.crashes.append(now)
    while slot.crashes and now - slot.crashes[0] > policy.window:
        slot.crashes.popleft()
    if len(slot.crashes) >= policy.max_crashes:
        return f"{len(slot.crashes)} crashes within {policy.window:.0f}s; stopping every worker"
    ran = now - slot.started_at
    slot.pause = (
        policy.backoff
        if ran >= policy.stable_seconds or slot.pause == 0
        else min(slot.pause * 2, policy.backoff_max)
    )
    return None
