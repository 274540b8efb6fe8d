"""Running the service: `diffq api`, `diffq worker`, `diffq relay`, `diffq webhooks`,
`diffq flower` (`diffq up`, all of them in one process tree, is cli/up.py)."""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import click

from app.broker.topology import WEBHOOK_QUEUE
from app.services import root

log = logging.getLogger(__name__)

# gunicorn's access log, as JSON lines when DIFFQ_LOG_FORMAT=json.
JSON_ACCESS_LOG = (
    '{"time": "%(t)s", "logger": "gunicorn.access", "remote": "%(h)s", "method": "%(m)s", '
    '"path": "%(U)s", "status": %(s)s, "bytes": "%(B)s", "duration_us": %(D)s}'
)


def api_environment(bind: str, metrics_port: int | None, threads: int) -> dict[str, str]:
    """What the gunicorn process tree reads beside the operator's environment: its bind
    (the default public URL), its metrics port, and a stream cap its threads can hold."""
    settings = root().settings
    env = {"DIFFQ_API_BIND": bind}
    if metrics_port is not None:
        env["DIFFQ_API_METRICS_PORT"] = str(max(0, metrics_port))
    if "DIFFQ_MAX_STREAMS" not in os.environ:
        # Each open stream holds a thread: a quarter of them stay for everything else.
        env["DIFFQ_MAX_STREAMS"] = str(min(settings.max_streams, threads - threads // 4))
    return env


def gunicorn_command(
    bind: str, workers: int, threads: int, metrics_port: int | None = None
) -> list[str]:
    settings = root().settings
    metrics = settings.api_metrics_port if metrics_port is None else max(0, metrics_port)
    trusted = ",".join(
        str(ipaddress.ip_network(p.strip(), strict=False))
        for p in settings.trusted_proxies.split(",")
        if p.strip()
    )
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "app.web.factory:create_app()",
        f"--bind={bind}",
        # /metrics on its own port (app/web/edge.py), never on the public one.
        *([f"--bind={settings.api_metrics_host}:{metrics}"] if metrics else []),
        # gunicorn believes X-Forwarded-Proto only from these (default: loopback).
        f"--forwarded-allow-ips={trusted}",
        f"--workers={workers}",
        # gthread, with the errors gunicorn answers by itself (431, 414, 400) in JSON.
        "--worker-class=app.web.http_worker.ThreadWorker",
        f"--threads={threads}",
        # Every open connection (event streams, requests still arriving, kept-alive ones)
        # counts against this; one waiting for its request costs a socket, not a thread.
        f"--worker-connections={max(settings.http_max_connections, 2 * threads)}",
        "--access-logfile=-",
        # Query strings are logged with tickets and other credentials redacted.
        "--logger-class=app.web.access_log.RedactingLogger",
        *(
            [f"--access-logformat={JSON_ACCESS_LOG}"]
            if root().settings.log_format == "json"
            else []
        ),
        "--graceful-timeout=20",
        f"--keep-alive={max(1, round(root().settings.http_keepalive))}",
    ]


def prepare_api_metrics(bind: str) -> None:
    """Give the gunicorn process tree its multiprocess metrics folder (emptied)."""
    from app.metrics import multiproc

    name = "api-" + bind.replace(":", "_").replace("/", "_")
    multiproc.use_directory(root().settings.metrics_dir / name)


_bind = click.option("--bind", help="host:port (default DIFFQ_API_BIND, 127.0.0.1:8000)")


@click.command("api")
@_bind
@click.option("--workers", type=int, default=2, show_default=True, help="gunicorn processes")
@click.option(
    "--threads",
    type=int,
    default=256,
    show_default=True,
    help="threads per process; each open event stream holds one",
)
@click.option(
    "--metrics-port",
    type=int,
    help="the port of the API's /metrics (default DIFFQ_API_METRICS_PORT, 9806; 0: off); "
    "never served on the public port",
)
def api(bind: str | None, workers: int, threads: int, metrics_port: int | None) -> int:
    """Serve the HTTP API with gunicorn."""
    bind = bind or root().settings.api_bind
    prepare_api_metrics(bind)
    os.environ.update(api_environment(bind, metrics_port, threads))
    command = gunicorn_command(bind, workers, threads, metrics_port)
    os.execv(command[0], command)
    return 1  # not reached


@click.command("worker")
@click.option(
    "--gpus",
    default="auto",
    show_default=True,
    help="GPU indexes like 0,1; 'all' for every GPU nvidia-smi lists (an error where it "
    "lists none); 'auto': those, or the CPU; 'none' for the CPU",
)
@click.option("--models", help="comma-separated model names (default: all configured)")
@click.option(
    "--queues",
    help="comma-separated queues to consume instead of the models' (e.g. only a model's "
    "high_priority_queue, for an on-demand pool)",
)
@click.option(
    "--name",
    help="node name prefix (default gpu, giving gpu0@host…; cpu without GPUs); "
    "two workers on one host need different names",
)
@click.option("--loglevel", default="info", show_default=True)
def worker(gpus: str, models: str | None, queues: str | None, name: str | None, loglevel: str):
    """Run GPU workers, one process per GPU."""
    from workers.devices import NoGpus, parse_gpus
    from workers.supervisor import queues_for, run_workers

    svc = root()
    chosen_models = [m.strip() for m in models.split(",")] if models else None
    chosen_queues = [q.strip() for q in queues.split(",")] if queues else None
    try:
        devices = parse_gpus(gpus)
    except (NoGpus, ValueError) as exc:
        print(f"diffq worker: {exc}", file=sys.stderr)
        return 2
    return run_workers(
        devices,
        queues_for(svc.catalog, chosen_models, chosen_queues),
        loglevel,
        name=name,
        # Past the shutdown grace, jobs are handed back; give that a minute to finish.
        grace=svc.settings.shutdown_grace + 60,
        settings=svc.settings,
    )


def relay_loop(stop: threading.Event, interval: float, heartbeat: str | None = None) -> None:
    from app.housekeeping.relay import Relay
    from app.metrics.instruments import RELAY_PASS_DURATION, RELAY_PASSES

    relay = root().derive(Relay, db_pool_size=1)
    for outcome in ("ok", "failed"):
        RELAY_PASSES.labels(outcome)  # both series from the start: rates and alerts see 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            relay.run_pass()
        except Exception:
            log.exception("relay pass failed; retrying")
            RELAY_PASSES.labels("failed").inc()
        else:
            RELAY_PASSES.labels("ok").inc()
        RELAY_PASS_DURATION.observe(time.monotonic() - started)
        if heartbeat:
            # The loop turns (a pass that failed on a broker or database outage counts:
            # restarting the relay would not bring either back).
            Path(heartbeat).touch()
        stop.wait(interval)
    relay.close()


@click.command(
    "relay",
    short_help="Housekeeping: the outbox's backstop, leases, deadlines, aging.",
)
@click.option(
    "--interval", type=float, default=2.0, show_default=True, help="seconds between scans"
)
@click.option(
    "--heartbeat",
    help="a file touched after every pass, failed or not (a liveness probe checks its age)",
)
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="its /metrics port (default DIFFQ_RELAY_METRICS_PORT, 9809; 0: off)",
)
def relay(interval: float, heartbeat: str | None, metrics_port: int | None) -> int:
    """Housekeeping: publish jobs whose first publish failed, requeue jobs whose worker
    vanished, cancel jobs past their deadline, raise long-waiting jobs' priority."""
    settings = root().settings
    serve_relay_metrics(
        settings.worker_metrics_host,
        settings.relay_metrics_port if metrics_port is None else metrics_port,
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    relay_loop(stop, interval, heartbeat)
    return 0


def serve_relay_metrics(host: str, port: int) -> None:
    """The relay's /metrics (its passes: DiffqRelayStalled), in a daemon thread; never a
    reason for the relay not to run."""
    if port <= 0:
        return
    from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    from app.metrics import multiproc

    registry = REGISTRY
    if multiproc.enabled():  # an environment inherited from a multiprocess parent
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        log.warning("relay metrics not served on %s:%s: %s", host, port, exc)
        return
    log.info("relay metrics on http://%s:%s/metrics", host, port)


def webhooks_command(concurrency: int, name: str, loglevel: str) -> list[str]:
    from workers.supervisor import worker_command

    return worker_command(name, [WEBHOOK_QUEUE], loglevel, pool="threads", concurrency=concurrency)


@click.command("webhooks", short_help="Deliver webhooks (a CPU worker, no model).")
@click.option(
    "--concurrency", type=int, default=16, show_default=True, help="deliveries at once (threads)"
)
@click.option("--name", default="webhooks", show_default=True, help="node name prefix")
@click.option(
    "--metrics-port", type=int, default=9807, show_default=True, help="its /metrics port (0: off)"
)
@click.option("--loglevel", default="info", show_default=True)
def webhooks(concurrency: int, name: str, metrics_port: int, loglevel: str) -> int:
    """Deliver webhooks: a CPU worker on the webhooks queue (no GPU, no model)."""
    from app.metrics import multiproc
    from workers import metrics as worker_metrics

    env = dict(os.environ, DIFFQ_WORKER_METRICS_PORT=str(max(0, metrics_port)))
    if metrics_port > 0:
        folder = multiproc.use_directory(worker_metrics.directory(root().settings, name))
        env[multiproc.ENV] = str(folder)
    command = webhooks_command(concurrency, name, loglevel)
    os.execve(command[0], command, env)
    return 1  # not reached


@click.command("flower", short_help="Flower, Celery's dashboard, with authentication on.")
@click.option("--bind", default="127.0.0.1:5555", show_default=True, help="host:port")
def flower(bind: str) -> int:
    """Flower, Celery's dashboard, on our app, with authentication on."""
    settings = root().settings
    if not settings.flower_auth or ":" not in settings.flower_auth:
        raise ValueError(
            "set DIFFQ_FLOWER_AUTH=user:password: Flower can revoke tasks and shut workers "
            "down, so diffq does not serve it without authentication"
        )
    management = root().broker.management_url()
    if management is None:
        raise ValueError("Flower needs RabbitMQ: set DIFFQ_BROKER_URL")
    host, _, port = bind.rpartition(":")
    env = dict(os.environ)
    # Through the environment, not the command line: ps shows arguments to everyone.
    env["FLOWER_BASIC_AUTH"] = settings.flower_auth
    env["FLOWER_BROKER_API"] = management
    command = [
        sys.executable,
        "-m",
        # Celery's flower command, with /metrics and /healthcheck behind the credentials
        # and no page frameable (cli/flower_guard.py).
        "cli.flower_guard",
        "-A",
        "tasks",
        "flower",
        f"--address={host or '127.0.0.1'}",
        f"--port={port}",
    ]
    os.execve(command[0], command, env)
    return 1  # not reached
