"""The worker's metrics: its process tree's multiprocess directory and the HTTP endpoint
its main process serves (DIFFQ_WORKER_METRICS_PORT; `diffq worker` gives each GPU's
worker the next port). Pool children only write; a child killed mid-job keeps what it
had counted, since its files stay in the directory."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from app.config import Settings
from app.metrics import multiproc

log = logging.getLogger(__name__)


def directory(settings: Settings, nodename: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.@-]", "_", nodename)
    return settings.metrics_dir / f"worker-{safe}"


def prepare(settings: Settings, nodename: str) -> None:
    """In the main process, before any pool child is forked. `diffq worker` has already
    given each worker its folder (the celery command imports prometheus_client, through
    Flower's plugin, before any of our code runs); a bare `celery worker` gets one here
    when it still can."""
    if settings.worker_metrics_port <= 0 or multiproc.enabled():
        return
    multiproc.use_directory(directory(settings, nodename))


def serve(settings: Settings) -> None:
    """Start the /metrics endpoint in the main process (a daemon thread)."""
    port = settings.worker_metrics_port
    if port <= 0:
        return
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    from app.metrics.gpu import GpuCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    gpus = [int(g) for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.isdigit()]
    if gpus:
        registry.register(GpuCollector(gpus))
    host = settings.worker_metrics_host
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        # Metrics never stop a worker from serving jobs.
        log.warning("worker metrics not served on %s:%s: %s", host, port, exc)
        return
    log.info("worker metrics on http://%s:%s/metrics", host, port)
