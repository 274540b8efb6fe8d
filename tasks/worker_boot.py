"""Worker start-up: check models and declare queues in the parent, load models in the child."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading

from celery import signals
from celery.exceptions import WorkerShutdown

from app import logs
from app.broker.topology import WEBHOOK_QUEUE, declare_topology
from app.catalog import load_catalog
from app.config import load_settings
from app.webhooks import events as _webhook_events  # noqa: F401 - subscribes to job changes
from workers import metrics as worker_metrics

log = logging.getLogger(__name__)
_runtime = None
_controller = None  # the WorkController, in the main process
# Sent by the main process to its pool children when a warm shutdown outlasts its grace.
HAND_BACK_SIGNAL = signal.SIGUSR2

# Exit status of a worker whose models cannot load (sysexits EX_CONFIG).
EXIT_MODEL_LOAD = 78
# Set by `diffq worker`: a file where a worker that no restart can cure says why, so the
# supervisor stops instead of restarting it (its own exit status is Celery's, not ours).
FATAL_MARKER_ENV = "DIFFQ_WORKER_FATAL_FILE"


def mark_fatal(reason: str) -> None:
    path = os.environ.get(FATAL_MARKER_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "w") as marker:
            marker.write(reason)


def _consumed_queues(consumer_queues) -> list[str]:
    return sorted(q.name for q in consumer_queues)


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def structured_logs(logger=None, **_kwargs) -> None:
    """Job fields on every line about a job; JSON lines with DIFFQ_LOG_FORMAT=json."""
    if logger is not None:
        logs.apply(logger, load_settings().log_format, keep_text=True)


@signals.worker_init.connect
def check_and_declare(sender=None, **_kwargs) -> None:
    """Runs in the worker's main process before any pool child exists."""
    global _controller
    _controller = sender
    settings = load_settings()
    worker_metrics.prepare(settings, sender.hostname)  # before anything imports the client
    queues = _consumed_queues(sender.app.amqp.queues.consume_from.values())
    if WEBHOOK_QUEUE in queues:
        if queues != [WEBHOOK_QUEUE]:
            raise WorkerShutdown("webhooks are delivered by their own workers (`diffq webhooks`)")
        if not settings.embedded:
            with sender.app.connection_for_write() as conn:
                declare_topology(conn, queues)
        os.environ["DIFFQ_WORKER_QUEUES"] = WEBHOOK_QUEUE
        worker_metrics.serve(settings)
        log.info("worker delivers webhooks from queue %s", WEBHOOK_QUEUE)
        return
    from workers.pipelines import ModelLoadError, check_model_dir, preimport_components
    from workers.runtime import served_models

    catalog = load_catalog(settings)
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
    if not settings.embedded:
        with sender.app.connection_for_write() as conn:
            declare_topology(conn, queues)
    os.environ["DIFFQ_WORKER_QUEUES"] = ",".join(queues)
    os.environ["DIFFQ_WORKER_NAME"] = sender.hostname
    # Import (never initialise CUDA) before forking: a pool child that replaces a dead
    # one then starts in well under a second instead of re-importing torch.
    import torch  # noqa: F401
    import transformers

    transformers.utils.logging.set_verbosity_error()
    for name in names:
        preimport_components(catalog.models[name])
    worker_metrics.serve(settings)
    log.info("worker serves models %s from queues %s", names, queues)


@signals.worker_shutting_down.connect
def hand_back_after_grace(**_kwargs) -> None:
    """Warm shutdown lets the running job finish; past DIFFQ_SHUTDOWN_GRACE seconds, the
    pool children stop it at the next step and return it to the queue."""
    grace = load_settings().shutdown_grace

    def expire() -> None:
        pool = getattr(getattr(_controller, "pool", None), "_pool", None)
        for process in getattr(pool, "_pool", None) or []:
            if process.pid and process.exitcode is None:
                log.warning(
                    "shutdown grace (%ss) over: handing back the job of pid %s", grace, process.pid
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, HAND_BACK_SIGNAL)

    timer = threading.Timer(grace, expire)
    timer.daemon = True
    timer.start()


@signals.worker_process_init.connect
def load_models(**_kwargs) -> None:
    """Runs in each pool child: the pipeline lives here, never in the forking parent."""
    global _runtime
    from workers.runtime import build_runtime

    queues = [q for q in os.environ.get("DIFFQ_WORKER_QUEUES", "").split(",") if q]
    if queues == [WEBHOOK_QUEUE]:
        return  # a delivery worker loads no model
    try:
        _runtime = build_runtime(load_settings(), queues)
        signal.signal(HAND_BACK_SIGNAL, lambda *_: _runtime.request_hand_back())
    except Exception:
        # A pool child that raises here is restarted forever by the pool; instead stop
        # the whole worker so the failure is seen (and a supervisor restarts it).
        log.critical("model load failed; stopping the worker", exc_info=True)
        mark_fatal(f"model load failed: {sys.exc_info()[1]}")
        os.kill(os.getppid(), signal.SIGTERM)
        sys.stderr.flush()
        os._exit(EXIT_MODEL_LOAD)


@signals.worker_process_shutdown.connect
def release(**_kwargs) -> None:
    if _runtime is not None:
        if _runtime.postprocessor is not None:
            # Jobs already acked are recorded before the process goes (or, past this, the
            # relay requeues them when their leases expire).
            _runtime.postprocessor.close(timeout=load_settings().shutdown_grace)
        _runtime.db.dispose()


_parent_db = None


def record_hard_timeout(payload, exc) -> None:
    """Mark a job whose pool child was killed by the hard time limit as failed/timeout."""
    global _parent_db
    from app.db.models import Job
    from app.db.session import Database
    from app.jobs import transitions
    from app.jobs.payload import InvalidPayload, parse_payload
    from app.jobs.states import ErrorCode

    try:
        job_id = parse_payload(payload).job_id
    except InvalidPayload:
        return
    if _parent_db is None:
        _parent_db = Database(load_settings().database_url, pool_size=1)
    with _parent_db.session() as session:
        failed = transitions.finish_failed(
            session,
            job_id,
            code=ErrorCode.TIMEOUT,
            message=f"the job exceeded its hard time limit ({exc}) and was stopped",
        )
        job = session.get(Job, job_id) if failed else None
    if job is not None:
        from app.metrics.instruments import JOBS_FINISHED

        JOBS_FINISHED.labels(job.model, "failed", ErrorCode.TIMEOUT.value).inc()
    log.error("job %s stopped by the hard time limit", job_id, extra={"job_id": str(job_id)})


def runtime():
    if _runtime is None:
        raise RuntimeError("worker runtime not initialised (worker_process_init did not run)")
    return _runtime
