"""Running the service: `diffq api`, `diffq worker`, `diffq relay`, `diffq up`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from app.broker.topology import WEBHOOK_QUEUE
from app.config import load_settings

log = logging.getLogger(__name__)


def register(commands) -> None:
    api = commands.add_parser("api", help="serve the HTTP API with gunicorn")
    api.add_argument("--bind", help="host:port (default DIFFQ_API_BIND, 127.0.0.1:8000)")
    api.add_argument("--workers", type=int, default=2, help="gunicorn processes (default 2)")
    api.add_argument(
        "--threads",
        type=int,
        default=256,
        help="threads per process (default 256); each open event stream holds one",
    )
    api.set_defaults(handler=run_api)

    worker = commands.add_parser("worker", help="run GPU workers, one process per GPU")
    worker.add_argument(
        "--gpus",
        default="auto",
        help="GPU indexes like 0,1; 'all' for every GPU nvidia-smi lists (an error where it "
        "lists none); 'auto' (default): those, or the CPU; 'none' for the CPU",
    )
    worker.add_argument("--models", help="comma-separated model names (default: all configured)")
    worker.add_argument(
        "--queues",
        help="comma-separated queues to consume instead of the models' (e.g. only a model's "
        "high_priority_queue, for an on-demand pool)",
    )
    worker.add_argument(
        "--name",
        help="node name prefix (default gpu, giving gpu0@host…; cpu without GPUs); "
        "two workers on one host need different names",
    )
    worker.add_argument("--loglevel", default="info")
    worker.set_defaults(handler=run_worker)

    relay = commands.add_parser(
        "relay",
        help="housekeeping: publish jobs whose first publish failed, requeue jobs whose "
        "worker vanished, cancel jobs past their deadline, raise long-waiting jobs' priority",
    )
    relay.add_argument("--interval", type=float, default=2.0, help="seconds between scans")
    relay.add_argument(
        "--heartbeat",
        help="a file touched after every pass, failed or not (a liveness probe checks its age)",
    )
    relay.set_defaults(handler=run_relay)

    hooks = commands.add_parser(
        "webhooks", help="deliver webhooks: a CPU worker on the webhooks queue (no GPU, no model)"
    )
    hooks.add_argument("--concurrency", type=int, default=16, help="deliveries at once (threads)")
    hooks.add_argument("--name", default="webhooks", help="node name prefix (default webhooks)")
    hooks.add_argument(
        "--metrics-port", type=int, default=9807, help="its /metrics port (0: off; default 9807)"
    )
    hooks.add_argument("--loglevel", default="info")
    hooks.set_defaults(handler=run_webhooks)

    flower = commands.add_parser(
        "flower", help="Flower, Celery's dashboard, on our app, with authentication on"
    )
    flower.add_argument("--bind", default="127.0.0.1:5555", help="host:port (default %(default)s)")
    flower.set_defaults(handler=run_flower)

    up = commands.add_parser("up", help="everything in one command, on the embedded defaults")
    up.add_argument("--bind", help="host:port (default DIFFQ_API_BIND, 127.0.0.1:8000)")
    up.set_defaults(handler=run_up)


# gunicorn's access log, as JSON lines when DIFFQ_LOG_FORMAT=json.
JSON_ACCESS_LOG = (
    '{"time": "%(t)s", "logger": "gunicorn.access", "remote": "%(h)s", "method": "%(m)s", '
    '"path": "%(U)s", "status": %(s)s, "bytes": "%(B)s", "duration_us": %(D)s}'
)


def gunicorn_command(bind: str, workers: int, threads: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "app.web.factory:create_app()",
        f"--bind={bind}",
        f"--workers={workers}",
        "--worker-class=gthread",
        f"--threads={threads}",
        # gthread counts every open connection (event streams included) against this.
        f"--worker-connections={max(1000, 2 * threads)}",
        "--access-logfile=-",
        *(
            [f"--access-logformat={JSON_ACCESS_LOG}"]
            if load_settings().log_format == "json"
            else []
        ),
        "--graceful-timeout=20",
        f"--keep-alive={max(1, round(load_settings().http_keepalive))}",
    ]


def prepare_api_metrics(bind: str) -> None:
    """Give the gunicorn process tree its multiprocess metrics folder (emptied)."""
    from app.metrics import multiproc

    name = "api-" + bind.replace(":", "_").replace("/", "_")
    multiproc.use_directory(load_settings().metrics_dir / name)


def run_api(args: argparse.Namespace) -> int:
    bind = args.bind or load_settings().api_bind
    prepare_api_metrics(bind)
    command = gunicorn_command(bind, args.workers, args.threads)
    os.execv(command[0], command)
    return 1  # not reached


def run_worker(args: argparse.Namespace) -> int:
    from app.catalog import load_catalog
    from workers.devices import NoGpus, parse_gpus
    from workers.supervisor import queues_for, run_workers

    settings = load_settings()
    catalog = load_catalog(settings)
    models = [m.strip() for m in args.models.split(",")] if args.models else None
    queues = [q.strip() for q in args.queues.split(",")] if args.queues else None
    try:
        gpus = parse_gpus(args.gpus)
    except (NoGpus, ValueError) as exc:
        print(f"diffq worker: {exc}", file=sys.stderr)
        return 2
    return run_workers(
        gpus,
        queues_for(catalog, models, queues),
        args.loglevel,
        name=args.name,
        # Past the shutdown grace, jobs are handed back; give that a minute to finish.
        grace=settings.shutdown_grace + 60,
    )


def relay_loop(stop: threading.Event, interval: float, heartbeat: str | None = None) -> None:
    from app.housekeeping.relay import relay_pass
    from app.services import root

    svc = root(db_pool_size=1)
    settings, db, publisher, storage = svc.settings, svc.db, svc.publisher, svc.storage
    while not stop.is_set():
        try:
            relay_pass(db, publisher, settings, storage)
        except Exception:
            log.exception("relay pass failed; retrying")
        if heartbeat:
            # The loop turns (a pass that failed on a broker or database outage counts:
            # restarting the relay would not bring either back).
            Path(heartbeat).touch()
        stop.wait(interval)
    db.dispose()


def run_relay(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    relay_loop(stop, args.interval, args.heartbeat)
    return 0


def webhooks_command(concurrency: int, name: str, loglevel: str) -> list[str]:
    from workers.supervisor import worker_command

    return worker_command(name, [WEBHOOK_QUEUE], loglevel, pool="threads", concurrency=concurrency)


def run_webhooks(args: argparse.Namespace) -> int:
    from app.metrics import multiproc
    from workers import metrics as worker_metrics

    settings = load_settings()
    env = dict(os.environ, DIFFQ_WORKER_METRICS_PORT=str(max(0, args.metrics_port)))
    if args.metrics_port > 0:
        folder = multiproc.use_directory(worker_metrics.directory(settings, args.name))
        env[multiproc.ENV] = str(folder)
    command = webhooks_command(args.concurrency, args.name, args.loglevel)
    os.execve(command[0], command, env)
    return 1  # not reached


def management_api_url(broker_url: str) -> str:
    """RabbitMQ's management API beside an amqp:// broker URL (same host and user, port
    15672): what Flower's broker tab reads when DIFFQ_RABBITMQ_API_URL is not set."""
    from urllib.parse import quote, unquote, urlsplit

    parts = urlsplit(broker_url)
    user = quote(unquote(parts.username or "guest"), safe="")
    password = quote(unquote(parts.password or "guest"), safe="")
    return f"http://{user}:{password}@{parts.hostname or '127.0.0.1'}:15672/api/"


def run_flower(args: argparse.Namespace) -> int:
    settings = load_settings()
    if not settings.flower_auth or ":" not in settings.flower_auth:
        raise ValueError(
            "set DIFFQ_FLOWER_AUTH=user:password: Flower can revoke tasks and shut workers "
            "down, so diffq does not serve it without authentication"
        )
    if settings.embedded:
        raise ValueError("Flower needs RabbitMQ: set DIFFQ_BROKER_URL")
    host, _, port = args.bind.rpartition(":")
    env = dict(os.environ)
    # Through the environment, not the command line: ps shows arguments to everyone.
    env["FLOWER_BASIC_AUTH"] = settings.flower_auth
    env["FLOWER_BROKER_API"] = settings.rabbitmq_api_url or management_api_url(settings.broker_url)
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tasks",
        "flower",
        f"--address={host or '127.0.0.1'}",
        f"--port={port}",
    ]
    os.execve(command[0], command, env)
    return 1  # not reached


def run_up(args: argparse.Namespace) -> int:
    from app.cli.up import run_embedded

    return run_embedded(args.bind)
