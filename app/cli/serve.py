"""Running the service: `diffq api`, `diffq worker`, `diffq relay`, `diffq up`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

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
        default="all",
        help="GPU indexes like 0,1; 'all' (default) for every GPU found; 'none' for the CPU",
    )
    worker.add_argument("--models", help="comma-separated model names (default: all configured)")
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
    relay.set_defaults(handler=run_relay)

    up = commands.add_parser("up", help="everything in one command, on the embedded defaults")
    up.add_argument("--bind", help="host:port (default DIFFQ_API_BIND, 127.0.0.1:8000)")
    up.set_defaults(handler=run_up)


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
        "--graceful-timeout=20",
    ]


def run_api(args: argparse.Namespace) -> int:
    bind = args.bind or load_settings().api_bind
    command = gunicorn_command(bind, args.workers, args.threads)
    os.execv(command[0], command)
    return 1  # not reached


def run_worker(args: argparse.Namespace) -> int:
    from app.catalog import load_catalog
    from workers.devices import parse_gpus
    from workers.supervisor import queues_for, run_workers

    settings = load_settings()
    catalog = load_catalog(settings)
    models = [m.strip() for m in args.models.split(",")] if args.models else None
    return run_workers(
        parse_gpus(args.gpus),
        queues_for(catalog, models),
        args.loglevel,
        name=args.name,
        # Past the shutdown grace, jobs are handed back; give that a minute to finish.
        grace=settings.shutdown_grace + 60,
    )


def relay_loop(stop: threading.Event, interval: float) -> None:
    from app.catalog import load_catalog
    from app.db.session import Database
    from app.publish import Publisher
    from app.relay import relay_pass

    settings = load_settings()
    db = Database(settings.database_url, pool_size=1)
    publisher = Publisher(
        load_catalog(settings), embedded=settings.embedded, timeout=settings.publish_timeout
    )
    while not stop.is_set():
        try:
            relay_pass(
                db,
                publisher,
                relay_after=settings.relay_after,
                aging=settings.priority_aging,
                max_attempts=settings.max_attempts,
            )
        except Exception:
            log.exception("relay pass failed; retrying")
        stop.wait(interval)
    db.dispose()


def run_relay(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    relay_loop(stop, args.interval)
    return 0


def run_up(args: argparse.Namespace) -> int:
    from app.cli.up import run_embedded

    return run_embedded(args.bind)
