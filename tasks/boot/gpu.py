"""A GPU worker: models checked in the main process, loaded in each pool child; warm
shutdown with a grace, then the running job handed back; hard time limits recorded."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading

from celery import signals
from celery.exceptions import WorkerShutdown
from sqlalchemy.orm import configure_mappers

from tasks.boot.common import EXIT_MODEL_LOAD, declare, mark_fatal
from tasks.celery_app import services

log = logging.getLogger(__name__)
# Sent by the main process to its pool children when a warm shutdown outlasts its grace.
HAND_BACK_SIGNAL = signal.SIGUSR2
# Sent by the main process to its pool children when a warm shutdown begins: a job that
# checkpoints and is far from its end saves its state and goes back at once.
DRAIN_SIGNAL = signal.SIGRTMIN

_controller = None  # the WorkController, in the main process
_queues: list[str] = []  # the queues consumed; pool children inherit it
_runtime = None  # a pool child's WorkerRuntime


def start(sender, queues: list[str]) -> None:
    """worker_init, in the main process: check every served model's files, declare the
    queues, import (never initialise CUDA) before forking, then hook the pool children."""
    global _controller
    from app.services import resource
    from workers import forkguard, pausing, stranded
    from workers import metrics as worker_metrics
    from workers.pipelines import ModelLoadError, check_model_dir, preimport_components
    from workers.runtime import served_models

    _controller = sender
    catalog = services().catalog
    names = served_models(catalog, queues)
    if not names:
        mark_fatal(f"no configured model uses the queues {queues}")
        raise WorkerShutdown(f"no configured model uses the queues {queues}")
    try:
        for name in names:
            check_model_dir(catalog.models[name])
    except ModelLoadError as exc:
        log.critical("worker cannot start: %s", exc)
        mark_fatal(str(exc))
        raise WorkerShutdown(str(exc)) from exc
    _queues[:] = queues
    os.environ["DIFFQ_WORKER_NAME"] = sender.hostname
    # The tokenizers' thread pool is not fork-safe; a pool child tokenizes on its own.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # A pool child that replaces a dead one then starts in well under a second instead
    # of re-importing torch.
    import torch  # noqa: F401
    import transformers

    transformers.utils.logging.set_verbosity_error()
    for name in names:
        preimport_components(catalog.models[name])
    # Hooked before anything that talks to the broker: a broker away at start must not
    # leave pool children without their models (every task would fail).
    signals.worker_shutting_down.connect(hand_back_after_grace)
    signals.worker_process_init.connect(load_models)
    signals.worker_process_shutdown.connect(release)
    worker_metrics.serve(services().settings)
    declare(sender, queues)
    # The watches below query through the ORM from threads of this process, which forks
    # the pool children at any time (a crashed child is replaced): a fork while a watch
    # configures the mappers would give the child a mapper lock held for ever (its first
    # query then hangs until its time limit). Configured here, before any thread, the
    # mappers never take that lock again.
    configure_mappers()
    # Built here, not by a watch's first tick racing the pool's first fork; and each
    # fork waits for the tick in progress (workers/forkguard.py).
    services().db  # noqa: B018 - built now
    forkguard.install(resource.reset_lock)
    stranded.start(sender, services(), queues)  # deliveries the broker strands
    pausing.start(sender, services(), queues)  # queues of paused models not consumed
    log.info("worker serves models %s from queues %s", names, queues)


def hand_back_after_grace(**_kwargs) -> None:
    """Warm shutdown: at once, a checkpointed job with more than DIFFQ_SHUTDOWN_FINISH
    seconds left saves its state and goes back to the queue (a spot notice is short); the
    others may finish, and past DIFFQ_SHUTDOWN_GRACE seconds the pool children stop them
    at the next step and return them to the queue."""
    grace = services().settings.shutdown_grace

    def children() -> list:
        pool = getattr(getattr(_controller, "pool", None), "_pool", None)
        return [p for p in getattr(pool, "_pool", None) or [] if p.pid and p.exitcode is None]

    for process in children():
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, DRAIN_SIGNAL)

    def expire() -> None:
        for process in children():
            log.warning(
                "shutdown grace (%ss) over: handing back the job of pid %s", grace, process.pid
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, HAND_BACK_SIGNAL)

    timer = threading.Timer(grace, expire)
    timer.daemon = True
    timer.start()


def load_models(**_kwargs) -> None:
    """worker_process_init, in each pool child: the pipeline lives here, never in the
    forking parent. The child's root is a GPU worker's (workers/runtime.py): the parent's
    settings, catalog and Celery app, its own connections and the loaded models."""
    global _runtime
    from app import services as root
    from workers.runtime import build_runtime

    try:
        _runtime = root.install(build_runtime(services(), list(_queues)))
        _runtime.report = report_outcome
        signal.signal(HAND_BACK_SIGNAL, lambda *_: _runtime.request_hand_back())
        signal.signal(DRAIN_SIGNAL, lambda *_: _runtime.request_drain())
    except Exception:
        # A pool child that raises here is restarted forever by the pool; instead stop
        # the whole worker so the failure is seen (and a supervisor restarts it).
        log.critical("model load failed; stopping the worker", exc_info=True)
        mark_fatal(f"model load failed: {sys.exc_info()[1]}")
        os.kill(os.getppid(), signal.SIGTERM)
        sys.stderr.flush()
        os._exit(EXIT_MODEL_LOAD)


def report_outcome(job, outcome) -> None:
    """A handed-over job's outcome as the event its task would have sent (its task id is
    the job id): succeeded, failed, or revoked where it ended without running to an
    outcome here. Flower and `celery events` count jobs, not hand-overs."""
    from celery import current_app

    from workers.outcome import Verdict

    if outcome.verdict == Verdict.ACK:
        event = {"type": "task-succeeded", "result": "None", "runtime": None}
    elif outcome.verdict == Verdict.DEAD_LETTER:
        event = {"type": "task-failed", "exception": outcome.reason, "traceback": None}
    else:
        event = {"type": "task-revoked", "terminated": False, "signum": None, "expired": False}
    try:
        with current_app.events.default_dispatcher(hostname=_runtime.name) as dispatcher:
            dispatcher.send(uuid=str(job.id), **event)
    except Exception as exc:  # noqa: BLE001 - a monitor's view, never the job's outcome
        log.warning("job %s: its outcome event was not sent (%s)", job.id, exc)


def release(**_kwargs) -> None:
    if _runtime is not None:
        if _runtime.postprocessor is not None:
            # Jobs already acked are recorded before the process goes (or, past this, the
            # relay requeues them when their leases expire).
            _runtime.postprocessor.close(timeout=_runtime.settings.shutdown_grace)
        _runtime.hold_nothing()
        _runtime.db.dispose()


def record_hard_timeout(payload, exc, pid: int | None) -> None:
    """In the main process: mark a job whose pool child (`pid`) was killed by the hard time
    limit as failed/timeout, if that child's run still held it. A run that hung may have
    been taken back since (its lease lapsed) and be running again elsewhere, or here in
    another child: that run is the job's now, and a limit on the hung one is not its."""
    from app.broker.payload import InvalidPayload, parse_payload
    from app.db.models.jobs import Job
    from app.jobs import transitions
    from app.jobs.states import ErrorCode, JobStatus

    try:
        job_id = parse_payload(payload).job_id
    except InvalidPayload:
        return
    child = f"{socket.gethostname()}:{pid}:" if pid else f"{socket.gethostname()}:"
    with services().db.session() as session:
        job = session.get(Job, job_id)
        held = job is not None and job.status == JobStatus.RUNNING
        owner = job.lease_owner if held else None
        if not owner or not owner.startswith(child):
            log.warning(
                "job %s: a hung run of it was stopped by the hard time limit; the job is no "
                "longer that run's (%s), so its state stands",
                job_id,
                job.status.value if job is not None else "gone",
                extra={"job_id": str(job_id)},
            )
            return
        failed = transitions.finish_failed(
            session,
            job_id,
            code=ErrorCode.TIMEOUT,
            message=f"the job exceeded its hard time limit ({exc}) and was stopped",
            owner=owner,
        )
        model = job.model
    if failed:
        from app.metrics.instruments import JOBS_FINISHED

        JOBS_FINISHED.labels(model, "failed", ErrorCode.TIMEOUT.value).inc()
    log.error("job %s stopped by the hard time limit", job_id, extra={"job_id": str(job_id)})


def runtime():
    """This pool child's runtime; loaded here if worker_process_init did not run in it
    (its handler is hooked before the pool forks, so this is a safety net: a task never
    fails for want of it)."""
    if _runtime is None:
        if not _queues:
            raise RuntimeError("worker not started: no queues (worker_init did not run)")
        log.warning("pool process %s had no runtime: loading its models now", os.getpid())
        load_models()
    return _runtime
