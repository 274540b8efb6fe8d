"""`diffq up`: database, tiny model, API, worker and relay in one command."""

from __future__ import annotations

import errno
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import click

from app import logs
from app.config import Settings
from app.services import Services, root
from cli.serve import api_environment, gunicorn_command, prepare_api_metrics, relay_loop
from workers.supervisor import ProcessGroup

DEMO_TENANT = "demo"
# scripts/up exports when it started (Unix time), before it ran scripts/bootstrap, and how
# many seconds bootstrap spent installing when it installed anything: the banner's time is
# the whole wait.
STARTED_ENV = "DIFFQ_UP_STARTED"
INSTALL_ENV = "DIFFQ_UP_INSTALL_SECONDS"
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


def _port_taken(host: str, port: int) -> bool:
    """Whether something already listens on host:port (the way gunicorn will bind it)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
    except OSError:
        return False  # gunicorn will say what is wrong with the address
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def check_bind(bind: str) -> None:
    """Refuse at once, with a free address to use instead, when `bind` is taken (gunicorn
    would retry for 5 s and exit with a traceback)."""
    host, _, port_text = bind.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise click.BadParameter(f"{bind!r}: expected HOST:PORT", param_hint="--bind") from None
    if not _port_taken(host, port):
        return
    free = next((p for p in range(port + 1, port + 50) if not _port_taken(host, p)), None)
    hint = f" --bind {host}:{free}" if free is not None else " --bind HOST:PORT"
    raise click.ClickException(
        f"{bind} is already in use (another diffq up, or another server). Choose another "
        f"address: scripts/up{hint} (or diffq up{hint}, or set DIFFQ_API_BIND)."
    )


def _shown(path: Path) -> str:
    """`path` as a shell in the current folder may type it."""
    try:
        return "./" + str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def cli_lines(url: str, key: str) -> list[str]:
    """How to reach the CLI from another shell: `diffq` is in the virtual environment,
    not on PATH."""
    scripts = Path(sys.executable).parent.resolve()
    diffq = scripts / "diffq"
    command = _shown(diffq) if diffq.exists() else "diffq"
    lines = []
    if (scripts / "activate").exists():
        lines.append(f"(source {_shown(scripts / 'activate')} puts diffq on PATH)")
    lines.append(f"export DIFFQ_URL={url} DIFFQ_API_KEY={key}")
    lines.append(f"{command} generate 'a red fox' -o fox.png")
    return lines


def _seconds(text: str | None) -> float | None:
    try:
        value = float(text or "")
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _process_age() -> float:
    """Seconds since this process started, from Linux's /proc (0 where there is none). A
    process keeps its start across exec: scripts/up execs `diffq up`."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return max(0.0, since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def start_time(environ=os.environ) -> float:
    """When the wait began (Unix time): scripts/up's start where it says so, else this
    process's."""
    now = time.time()
    exported = _seconds(environ.get(STARTED_ENV))
    if exported is not None and exported <= now:
        return exported
    return now - _process_age()


def install_seconds(environ=os.environ) -> float:
    """Seconds scripts/up's bootstrap spent installing (0: it installed nothing)."""
    return max(0.0, _seconds(environ.get(INSTALL_ENV)) or 0.0)


def banner(url: str, key: str, home: Path, seconds: float, installing: float = 0.0) -> str:
    cli = "".join(f"  {line}\n" for line in cli_lines(url, key))
    install = f"{installing:.0f} s installing; " if round(installing) > 0 else ""
    return (
        f"\ndiffq is up in {seconds:.0f} s "
        f"({install}embedded: SQLite, local images, filesystem broker)\n"
        f"  page     {url}/ui\n"
        f"  API      {url}   (docs: {url}/docs)\n"
        f"  API key  {key}\n"
        f"  data     {home}\n"
        f"  stop     Ctrl-C here (or SIGTERM to pid {os.getpid()})\n\n"
        f"  curl -s -X POST {url}/v1/jobs -H 'Authorization: Bearer {key}' \\\n"
        f"       -H 'Content-Type: application/json' -d '{{\"prompt\": \"a red fox\"}}'\n\n"
        f"  The CLI, from another shell:\n{cli}"
    )


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


def _build_demo_models(catalog) -> None:
    """The tiny image and video models of the embedded catalog and its tiny ControlNet,
    built once (offline)."""
    from workers.tiny import build_tiny_controlnet, build_tiny_model

    for spec in catalog.models.values():
        if not spec.path.exists():
            print(f"building the tiny demo model {spec.name} in {spec.path} ...", flush=True)
            build_tiny_model(spec.path, family=spec.family)
    for controlnet in catalog.controlnets.values():
        if not controlnet.path.exists():
            print(f"building the tiny ControlNet {controlnet.name} ...", flush=True)
            build_tiny_controlnet(controlnet.path)


@click.command("up")
@click.option("--bind", help="host:port (default DIFFQ_API_BIND, 127.0.0.1:8000)")
def up(bind: str | None) -> int:
    """Everything in one command, on the embedded defaults. Ctrl-C stops it."""
    from app.db.migrate import upgrade

    started = start_time()
    svc = root(db_pool_size=1)  # the demo key and the relay's thread share it
    settings = svc.settings
    logs.quiet_libraries(settings.log_level)
    bind = bind or settings.api_bind
    check_bind(bind)
    settings.home.mkdir(parents=True, exist_ok=True)
    if settings.models_file is None:
        _build_demo_models(svc.catalog)
    upgrade(settings.database_url)
    key = _demo_key(svc)
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
    # The API's /metrics port only where one is asked for (two `diffq up` side by side).
    metrics_port = settings.api_metrics_port if "DIFFQ_API_METRICS_PORT" in os.environ else 0
    os.environ.update(api_environment(bind, metrics_port, threads=64))
    group.start(gunicorn_command(bind, workers=1, threads=64, metrics_port=metrics_port))
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
        took = time.time() - started
        print(banner(url, key, settings.home, took, install_seconds()), flush=True)
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
