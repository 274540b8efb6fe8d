"""Quorum queues on a private 3-node RabbitMQ cluster on loopback: the leader of the GPU
queue is stopped under steady submits; counts lost and duplicated jobs.

    .venv/bin/python -m bench.quorum_cluster [--seconds 20] [--period 0.5]

Needs the suite's services (`eval "$(scripts/services)"`) for PostgreSQL and the
rabbitmq-server binaries. Every process gets DIFFQ_QUEUE_TYPE=quorum and a broker URL
listing the three nodes (kombu fails over between them).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import requests
from kombu import Connection
from sqlalchemy import select

from testbed.jobs import auth
from testbed.private_rabbit import PrivateRabbitMQ
from testbed.processes import ApiServer, ManagedProcess, start_worker
from testbed.stack import start_stack

QUEUE = "gpu.tiny"


def cluster(workdir: Path) -> list[PrivateRabbitMQ]:
    nodes = [PrivateRabbitMQ(workdir / f"rabbit{i}") for i in range(3)]
    threads = [threading.Thread(target=n.start) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for node in nodes[1:]:
        node._ctl("stop_app").check_returncode()
        node._ctl("join_cluster", nodes[0].node).check_returncode()
        node._ctl("start_app").check_returncode()
    return nodes


def leader(node: PrivateRabbitMQ, queue: str) -> str:
    out = node._ctl("list_queues", "name", "leader", "--quiet").stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == queue:
            return parts[1]
    raise RuntimeError(f"no leader for {queue}: {out}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--period", type=float, default=0.5)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="quorum-"))
    nodes = cluster(workdir)
    url = ";".join(n.url for n in nodes)
    env_extra = {"DIFFQ_QUEUE_TYPE": "quorum", "DIFFQ_LEASE_SECONDS": "6"}
    stack = start_stack(workdir / "stack", env_extra)
    env = {**stack.env, **env_extra, "DIFFQ_BROKER_URL": url, "OMP_NUM_THREADS": "1"}

    os.environ.update({"DIFFQ_QUEUE_TYPE": "quorum"})
    from app.broker.topology import declare_topology
    from app.db.models import Job
    from app.db.session import Database
    from app.keys import create_key, get_or_create_tenant

    with Connection(url) as conn:
        declare_topology(conn, [QUEUE, "webhooks"])
    db = Database(stack.database_url)
    with db.session() as session:
        key = create_key(session, get_or_create_tenant(session, "quorum"), "bench")
    api = ApiServer(env, stack.logs).start()
    relay = ManagedProcess(
        "relay", [sys.executable, "-m", "cli", "relay", "--interval", "0.5"], env, stack.logs
    ).start()
    worker = start_worker(env, stack.logs, "worker-q", models="tiny")
    accepted, refused, latencies = [], 0, []
    stop = threading.Event()

    def submit_loop():
        nonlocal refused
        while not stop.is_set():
            started = time.monotonic()
            try:
                r = requests.post(
                    f"{api.url}/v1/jobs",
                    json={"prompt": "q", "steps": 4},
                    headers=auth(key),
                    timeout=30,
                )
                if r.status_code == 202:
                    accepted.append(r.json()["id"])
                else:
                    refused += 1
            except requests.RequestException:
                refused += 1
            latencies.append(time.monotonic() - started)
            stop.wait(args.period)

    thread = threading.Thread(target=submit_loop)
    thread.start()
    try:
        time.sleep(args.seconds / 2)
        name = leader(nodes[0], QUEUE)
        victim = next(n for n in nodes if n.node == name)
        print(f"stopping the leader of {QUEUE}: {name}")
        victim.stop()
        time.sleep(args.seconds / 2)
        print(f"new leader: {leader(next(n for n in nodes if n is not victim), QUEUE)}")
        victim.start()
    finally:
        stop.set()
        thread.join()
    deadline = time.monotonic() + 180
    ids = [uuid.UUID(j) for j in accepted]
    while time.monotonic() < deadline:
        with db.session() as session:
            rows = list(session.scalars(select(Job).where(Job.id.in_(ids))))
        if all(r.status.terminal for r in rows):
            break
        time.sleep(1)
    log = worker.log()
    successes = {j: len(re.findall(rf"job {j} succeeded in", log)) for j in accepted}
    lost = sum(not r.status.terminal for r in rows)
    dups = sum(n > 1 for n in successes.values())
    ok = sum(r.status.value == "succeeded" for r in rows)
    print(
        f"submitted={len(accepted) + refused} accepted={len(accepted)} refused={refused} "
        f"succeeded={ok} lost={lost} duplicate_results={dups} "
        f"slowest POST {max(latencies):.2f}s"
    )
    worker.stop()
    relay.stop()
    api.stop()
    db.dispose()
    stack.close()
    for node in nodes:
        node.close()
    return 0 if lost == 0 and dups == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
