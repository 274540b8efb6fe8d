"""The worker's metrics: its process tree's multiprocess directory and the HTTP endpoint
its main process serves (DIFFQ_WORKER_METRICS_PORT; `diffq worker` gives each GPU's
worker the next port). Pool children only write; a child killed mid-job keeps what it
had counted, since its files stay in the directory."""

from __future__ import annotations

import logging
import os
import re
import threading
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
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    from app.metrics.gpu import GpuCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    gpus = [int(g) for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.isdigit()]
    if gpus:
        registry.register(GpuCollector(gpus))
    host = settings.worker_metrics_host
    try:
        _serve(host, port, registry)
    except OSError as exc:
        # Metrics never stop a worker from serving jobs.
        log.warning("worker metrics not served on %s:%s: %s", host, port, exc)
        return
    log.info("worker metrics on http://%s:%s/metrics, liveness on /healthz", host, port)


def _serve(host: str, port: int, registry) -> None:
    """/metrics from the registry, /healthz from the heartbeat, in a daemon thread."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import make_wsgi_app

    from workers.heartbeat import wsgi_health

    metrics_app = make_wsgi_app(registry)

    def app(environ, start_response):
        if environ.get("PATH_INFO") == "/healthz":
            return wsgi_health(environ, start_response)
        return metrics_app(environ, start_response)

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, *_args) -> None:  # probes every few seconds: not logged
            pass

    server = make_server(host, port, app, server_class=Server, handler_class=QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
