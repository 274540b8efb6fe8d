"""`diffq up`: database, tiny model, API, worker and relay in one command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import click

from app.config import Settings
from app.services import Services, root
from cli.serve import gunicorn_command, prepare_api_metrics, relay_loop
from workers.supervisor import ProcessGroup

DEMO_TENANT = "demo"
# The embedded worker runs tiny jobs: a stop that takes longer than this is stuck.
STOP_GRACE_SECONDS = 20.0


def _demo_key(svc: Services) -> str:
    """The demo tenant's key, kept in DIFFQ_HOME so each start prints the same one."""
    from app.keys import create_key, get_or_create_tenant

    settings: Settings = svc.settings
    path = settings.home / "demo_api_key"
    if path.exists():
        return path.read_text().strip()
    with svc.db.session() as session:
        key = create_key(session, get_or_create_tenant(session, DEMO_TENANT), "diffq up")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key)
    return key


def _echo_and_watch(stream, marker: str, seen: threading.Event) -> None:
    """Copy a child's output to ours, and note when `marker` first appears in it."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        sys.stdout.write(line)
        sys.stdout.flush()
        if marker in line:
            seen.set()


def _wait_ready(
    url: str, children: list[subprocess.Popen], worker_ready: threading.Event, timeout: float = 120
) -> bool:
    """The API answers /readyz and the worker has loaded and warmed its model."""
    deadline = time.monotonic() + timeout
    api_ready = False
    while time.monotonic() < deadline:
        if any(child.poll() is not None for child in children):
            return False
        if not api_ready:
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=2) as response:
                    api_ready = response.status == 200
            except OSError:
                pass
        if api_ready and worker_ready.wait(0.3):
            return True
        time.sleep(0.1)
    return False


@click.command("up")
@click.option("--bind", help="host:port (default DIFFQ_API_BIND, 127.0.0.1:8000)")
def up(bind: str | None) -> int:
    """Everything in one command, on the embedded defaults."""
    from app.db.migrate import upgrade

    svc = root(db_pool_size=1)  # the demo key and the relay's thread share it
    settings = svc.settings
    settings.home.mkdir(parents=True, exist_ok=True)
    default = svc.catalog.get(None)
    if settings.models_file is None and not default.path.exists():
        print(f"building the tiny demo model in {default.path} ...", flush=True)
        from workers.tiny import build_tiny_model

        build_tiny_model(default.path)
    upgrade(settings.database_url)
    key = _demo_key(svc)
    bind = bind or settings.api_bind
    url = f"http://{bind}"

    group = ProcessGroup()
    worker = group.start(
        [sys.executable, "-m", "cli", "worker", "--gpus", "auto"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    worker_ready = threading.Event()
    threading.Thread(
        target=_echo_and_watch, args=(worker.stdout, "warmed up in", worker_ready), daemon=True
    ).start()
    group.start(
        [sys.executable, "-m", "cli", "webhooks", "--concurrency", "4", "--metrics-port", "0"]
    )
    prepare_api_metrics(bind)
    group.start(gunicorn_command(bind, workers=1, threads=64))
    children = group.children
    stop = threading.Event()
    relay = threading.Thread(target=relay_loop, args=(stop, 2.0), daemon=True)
    relay.start()

    def shutdown(*_args) -> None:
        if stop.is_set():
            group.request_stop()  # a second Ctrl-C: stop harder
        stop.set()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    status = 0
    if _wait_ready(url, children, worker_ready):
        print(
            f"\ndiffq is up (embedded: SQLite, local images, filesystem broker)\n"
            f"  page     {url}/ui\n"
            f"  API      {url}   (docs: {url}/docs)\n"
            f"  API key  {key}\n"
            f"  data     {settings.home}\n\n"
            f"  curl -s -X POST {url}/v1/jobs -H 'Authorization: Bearer {key}' \\\n"
            f"       -H 'Content-Type: application/json' -d '{{\"prompt\": \"a red fox\"}}'\n",
            flush=True,
        )
    else:
        print("diffq: the API or the worker did not start; see the log above", file=sys.stderr)
        status = 1
        stop.set()
    while not stop.is_set():
        if any(child.poll() is not None for child in children):
            print("diffq: a component exited; stopping", file=sys.stderr)
            status = 1
            break
        stop.wait(0.5)
    group.request_stop()
    while group.alive():
        group.escalate_if_overdue(STOP_GRACE_SECONDS)
        time.sleep(0.2)
    return status
