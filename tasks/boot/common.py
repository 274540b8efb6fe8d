"""What every worker does at start, whatever its role."""

from __future__ import annotations

import contextlib
import logging
import os

from celery import signals

from app import logs
from app.broker.topology import WEBHOOK_QUEUE
from tasks.celery_app import services

log = logging.getLogger(__name__)

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


def declare(sender, queues: list[str]) -> None:
    """Declare the consumed queues (and what the broker backend needs with them, e.g.
    their DLQs) before consuming. A broker away at start (a node down, a partition) does
    not stop the worker: the consumer declares the same queues, with the same arguments,
    when it connects, and the API and the relay declare them with their DLQs."""
    try:
        with sender.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
            services().broker.declare(conn, queues)
    except Exception as exc:  # noqa: BLE001 - logged; the consumer declares them anyway
        log.warning("queues %s not declared at start (%s); the consumer will", queues, exc)


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def structured_logs(logger=None, **_kwargs) -> None:
    """Job fields on every line about a job; JSON lines with DIFFQ_LOG_FORMAT=json; the
    libraries' start-up chatter left out, as in every diffq process (app/logs.py)."""
    logs.quiet_libraries(services().settings.log_level)
    if logger is not None:
        logs.apply(logger, services().settings.log_format, keep_text=True)


@signals.worker_init.connect
def start_role(sender=None, **_kwargs) -> None:
    """Runs in the worker's main process before any pool child exists."""
    from workers import metrics as worker_metrics

    worker_metrics.prepare(services().settings, sender.hostname)  # before the client loads
    queues = sorted(q.name for q in sender.app.amqp.queues.consume_from.values())
    if WEBHOOK_QUEUE in queues:
        from tasks.boot import webhooks

        webhooks.start(sender, queues)
    else:
        from tasks.boot import gpu

        gpu.start(sender, queues)
