"""Submit throughput under concurrency, against the least a durable submit can do.

    .venv/bin/python -m bench.submit_throughput [--seconds 6] [--rounds 3]
        [--clients 16,64] [--before PATH]

Every server runs under diffq's shipped gunicorn flags (`diffq api`'s defaults: 2
processes x 256 gthread threads), on the same private PostgreSQL database and RabbitMQ
vhost, with no GPU worker running:

- diffq: `python -m cli api`, exactly as `diffq api` starts it; one tenant, one key,
  the rate limit and the queued cap counted (set high enough never to refuse);
- minimal: bench/minimal_submit.py, the least a durable submit can do (look the key up,
  INSERT the row and COMMIT, publish one persistent message with confirms, answer 202);
- parse only: the same Flask app answering after parsing the body;
- with `--before PATH`: diffq from another checkout (say `git archive main`), on the same
  database (migrated by this checkout).

N clients (threads, one keep-alive connection each) POST as fast as answers come. The
servers take turns, `--rounds` times per client count, each for `--seconds`, so a machine
loaded by other work weighs on them alike; before every turn the queued jobs are canceled
and the queues purged, so every turn starts from an empty queue. Ratios are against the
minimal submit of the same run. "CPU ms/submit" is the server's own processes' CPU per
accepted submit; "machine CPU ms/submit" is the whole machine's busy time per accepted
submit (the server, PostgreSQL, RabbitMQ and the client threads): when submits/s times
it comes near the machine's CPU count times 1,000, the run is CPU-bound.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.report import percentile, print_table
from testbed.ports import free_port
from testbed.processes import ManagedProcess
from testbed.stack import QUEUES, start_stack

MINIMAL_QUEUE = "bench.minimal"
BODY = json.dumps({"prompt": "benchmark", "steps": 2}).encode()


@dataclass
class Server:
    name: str
    process: ManagedProcess
    port: int
    path: str  # what clients POST to
    samples: dict[int, list[float]] = field(default_factory=dict)  # clients -> ms
    elapsed: dict[int, float] = field(default_factory=dict)  # clients -> seconds
    refused: dict[int, int] = field(default_factory=dict)  # clients -> non-202 answers
    cpu: dict[int, float] = field(default_factory=dict)  # clients -> the servers' CPU seconds
    machine: dict[int, float] = field(default_factory=dict)  # clients -> every process's


def _gunicorn(target: str, bind: str) -> list[str]:
    """diffq's shipped gunicorn command (as `diffq api` builds it) serving `target`, with
    no metrics port (diffq's own server holds DIFFQ_API_METRICS_PORT)."""
    from cli.serve import gunicorn_command

    command = gunicorn_command(bind, 2, 256, metrics_port=0)
    return [target if arg == "app.web.factory:create_app()" else arg for arg in command]


def _diffq_api(name: str, env: dict, logs: Path, checkout: Path | None) -> tuple:
    port = free_port()
    # `diffq api`'s module: `cli` here, `app.cli` in a checkout from before it moved.
    here = Path(__file__).resolve().parent.parent
    module = "cli" if ((checkout or here) / "cli" / "__main__.py").exists() else "app.cli"
    args = [sys.executable, "-m", module, "api", "--bind", f"127.0.0.1:{port}"]
    if checkout is not None:
        env = {**env, "PYTHONPATH": str(checkout)}
        args = ["/bin/sh", "-c", f'cd "{checkout}" && exec "$0" "$@"', *args]
    return ManagedProcess(name, args, env, logs), port


def _wait_up(server: Server, path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status < 500:
                return
        except OSError:
            pass
        if server.process.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited:\n{server.process.log()[-3000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"{server.name} not up:\n{server.process.log()[-3000:]}")


def _cpu_seconds(group: int) -> float:
    """User + system CPU of every process in the process group (gunicorn and workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:  # pgrp
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def _machine_cpu_seconds() -> float:
    """Busy CPU of the whole machine (/proc/stat): the API, PostgreSQL, RabbitMQ, the
    clients and anything else running."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _drive(server: Server, key: str, clients: int, seconds: float) -> None:
    """`clients` threads POST the body back to back for `seconds`."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    latencies: list[list[float]] = [[] for _ in range(clients)]
    refused = [0] * clients
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        start.wait()
        while time.perf_counter() < stop_at[0]:
            began = time.perf_counter()
            conn.request("POST", server.path, BODY, headers)
            response = conn.getresponse()
            response.read()
            took = (time.perf_counter() - began) * 1000
            if response.status == 202:
                latencies[i].append(took)
            else:
                refused[i] += 1
        conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    cpu, machine = _cpu_seconds(server.process.pid), _machine_cpu_seconds()
    stop_at[0] = time.perf_counter() + seconds
    began = time.perf_counter()
    start.wait()
    for thread in threads:
        thread.join()
    server.cpu[clients] = server.cpu.get(clients, 0.0) + _cpu_seconds(server.process.pid) - cpu
    server.machine[clients] = server.machine.get(clients, 0.0) + _machine_cpu_seconds() - machine
    server.elapsed[clients] = server.elapsed.get(clients, 0.0) + time.perf_counter() - began
    server.samples.setdefault(clients, []).extend(x for own in latencies for x in own)
    server.refused[clients] = server.refused.get(clients, 0) + sum(refused)


def _reset(database_url: str, broker_url: str) -> None:
    """Every turn starts from an empty queue: queued jobs canceled, queues purged."""
    import psycopg2
    from kombu import Connection

    conn = psycopg2.connect(database_url)
    with conn, conn.cursor() as cur:
        cur.execute(
            "UPDATE jobs SET status = 'canceled', finished_at = now() WHERE status = 'queued'"
        )
    conn.close()
    with Connection(broker_url) as broker:
        channel = broker.channel()
        for queue in (*QUEUES, MINIMAL_QUEUE):
            try:
                channel.queue_purge(queue)
            except Exception:  # noqa: BLE001 - not declared yet
                channel = broker.channel()
    time.sleep(1.0)  # let the vacuum and the WAL writer catch up between turns


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="16,64")
    parser.add_argument("--before", type=Path, help="another diffq checkout to run alongside")
    parser.add_argument("--no-parse", action="store_true", help="leave out the parse-only row")
    parser.add_argument(
        "--max-queued",
        default="100000000",
        help="diffq's DIFFQ_MAX_QUEUED (default: counted, never refusing; 0: no cap, no lock)",
    )
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(Path(tmp))
        # Counted, never refusing: every submit pays for the rate limit and the cap.
        env = {**stack.env, "DIFFQ_RATE_LIMIT": "100000000", "DIFFQ_MAX_QUEUED": args.max_queued}
        pg_url = stack.database_url.replace("+psycopg2", "")
        servers: list[Server] = []
        try:
            from app.db.session import Database
            from app.keys import create_key, get_or_create_tenant

            db = Database(stack.database_url, pool_size=1)
            with db.session() as session:
                key = create_key(session, get_or_create_tenant(session, "bench"), "bench")
            with db.engine.begin() as conn:
                from bench.minimal_submit import create_table

                create_table(conn.connection.cursor())
            db.dispose()

            process, port = _diffq_api("bench-diffq", env, stack.logs, None)
            servers.append(Server("diffq", process, port, "/v1/jobs"))
            if args.before:
                process, port = _diffq_api("bench-before", env, stack.logs, args.before)
                name = f"diffq before ({args.before.name})"
                servers.append(Server(name, process, port, "/v1/jobs"))
            minimal_env = {
                **env,
                "BENCH_DATABASE_URL": pg_url,
                "BENCH_BROKER_URL": stack.broker_url,
                "BENCH_QUEUE": MINIMAL_QUEUE,
            }
            for name, path in (("minimal durable submit", "/submit"), ("parse only", "/parse")):
                if path == "/parse" and args.no_parse:
                    continue
                port = free_port()
                command = _gunicorn("bench.minimal_submit:create_app()", f"127.0.0.1:{port}")
                process = ManagedProcess(f"bench-{path[1:]}", command, minimal_env, stack.logs)
                servers.append(Server(name, process, port, path))
            for server in servers:
                server.process.start()
            for server in servers:
                _wait_up(server, "/healthz" if server.path == "/v1/jobs" else "/")
            for server in servers:  # warm every process, its pools and the broker channels
                _drive(server, key, 8, 2.0)
                for kept in (
                    server.samples,
                    server.elapsed,
                    server.refused,
                    server.cpu,
                    server.machine,
                ):
                    kept.clear()

            for clients in counts:
                for turn in range(args.rounds):
                    order = servers[turn % len(servers) :] + servers[: turn % len(servers)]
                    for server in order:
                        _reset(pg_url, stack.broker_url)
                        _drive(server, key, clients, args.seconds)
        finally:
            for server in servers:
                server.process.stop()
            stack.close()

    rows = []
    for clients in counts:
        minimal = next(s for s in servers if s.path == "/submit")
        base_rate = len(minimal.samples[clients]) / minimal.elapsed[clients]
        base_p99 = percentile(minimal.samples[clients], 99)
        for server in servers:
            samples = server.samples[clients]
            rate = len(samples) / server.elapsed[clients]
            p99 = percentile(samples, 99)
            rows.append(
                {
                    "clients": clients,
                    "server": server.name,
                    "submits": len(samples),
                    "not 202": server.refused[clients],
                    "submits/s": rate,
                    "p50 ms": percentile(samples, 50),
                    "p99 ms": p99,
                    "CPU ms/submit": 1000 * server.cpu[clients] / max(1, len(samples)),
                    "machine CPU ms/submit": 1000 * server.machine[clients] / max(1, len(samples)),
                    "rate / minimal": rate / base_rate,
                    "p99 / minimal": p99 / base_p99,
                }
            )
    print_table(
        f"Submit throughput, one tenant ({args.rounds} turns x {args.seconds:g} s per server "
        f"and client count; gunicorn 2 x 256 gthread; PostgreSQL + RabbitMQ with confirms; "
        f"{os.cpu_count()} CPUs)",
        rows,
        list(rows[0]),
    )


if __name__ == "__main__":
    main()
