"""Batch ingest: jobs accepted per second for one batch of N lines against 16 clients
submitting singly, in the same run; and the time until the batch's first job starts.

    .venv/bin/python -m bench.batch_ingest [--lines 10000] [--rounds 2] [--seconds 8]

One private stack (PostgreSQL, RabbitMQ with confirms, S3), `diffq api` with its shipped
gunicorn flags (2 processes x 256 threads), one tenant, the rate limit and the queued
cap counted but set high enough never to refuse. Turns alternate between the two ways
(`--rounds` each), every turn from an empty queue (queued jobs canceled, queues purged):

- baseline: 16 clients (threads, one keep-alive connection each) POST /v1/jobs back to
  back for `--seconds`; jobs/s = 202s / elapsed;
- batch: one POST /v1/batches with N lines (JSON Lines), timed from the request to its
  202 (every job stored, and published with the broker's confirms); jobs/s = N / elapsed.

Then, with one GPU worker (the tiny model, on the CPU) consuming: the time from the POST
of a batch to its first job's `started_at`, and the same for one single submit.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import tempfile
import time
import uuid
from pathlib import Path

from bench.report import percentile, print_table
from bench.submit_throughput import Server, _diffq_api, _drive, _reset, _wait_up
from testbed.processes import start_worker
from testbed.stack import start_stack

LINE = {"prompt": "benchmark", "steps": 2}


def _jsonl(lines: int) -> bytes:
    return "".join(json.dumps({"custom_id": f"l{i}", **LINE}) + "\n" for i in range(lines)).encode()


def _post_batch(port: int, key: str, body: bytes) -> tuple[float, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/jsonl"}
    began = time.perf_counter()
    conn.request("POST", "/v1/batches", body, headers)
    response = conn.getresponse()
    answer = json.loads(response.read())
    took = time.perf_counter() - began
    conn.close()
    if response.status != 202:
        raise RuntimeError(f"batch refused: {response.status} {answer}")
    return took, answer


def _first_start(database_url: str, where: str, params: tuple, since: float) -> float:
    """Seconds from `since` (epoch) to the first job matching `where` starting."""
    import psycopg2

    conn = psycopg2.connect(database_url)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with conn, conn.cursor() as cur:
                cur.execute(
                    f"SELECT extract(epoch FROM min(started_at)) FROM jobs WHERE {where}", params
                )
                (started,) = cur.fetchone()
            if started is not None:
                return float(started) - since
            time.sleep(0.02)
    finally:
        conn.close()
    raise TimeoutError("no job started")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    body = _jsonl(args.lines)
    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(Path(tmp))
        env = {
            **stack.env,
            "DIFFQ_RATE_LIMIT": "100000000",
            "DIFFQ_MAX_QUEUED": "100000000",
            "DIFFQ_BATCH_MAX_LINES": str(max(args.lines, 50_000)),
        }
        pg_url = stack.database_url.replace("+psycopg2", "")
        worker = None
        try:
            from app.db.session import Database
            from app.keys import create_key, get_or_create_tenant

            db = Database(stack.database_url, pool_size=1)
            with db.session() as session:
                key = create_key(session, get_or_create_tenant(session, "bench"), "bench")
            db.dispose()
            process, port = _diffq_api("bench-batches", env, stack.logs, None)
            server = Server("diffq", process, port, "/v1/jobs")
            process.start()
            _wait_up(server, "/healthz")
            _drive(server, key, 8, 2.0)  # warm the processes, pools and channels
            _post_batch(port, key, _jsonl(200))
            server.samples.clear()
            server.elapsed.clear()
            batch_times: list[float] = []
            for _ in range(args.rounds):
                _reset(pg_url, stack.broker_url)
                _drive(server, key, args.clients, args.seconds)
                _reset(pg_url, stack.broker_url)
                took, _answer = _post_batch(port, key, body)
                batch_times.append(took)
            singles = server.samples[args.clients]
            single_rate = len(singles) / server.elapsed[args.clients]
            batch_rate = args.lines * len(batch_times) / sum(batch_times)

            # The first start, with a worker consuming.
            _reset(pg_url, stack.broker_url)
            worker = start_worker(env, stack.logs, "bench-worker", models="tiny")
            began = time.time()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request(
                "POST",
                "/v1/jobs",
                json.dumps(LINE).encode(),
                {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            job = json.loads(conn.getresponse().read())
            single_first = _first_start(pg_url, "id = %s", (job["id"],), began)
            _reset(pg_url, stack.broker_url)
            began = time.time()
            took, answer = _post_batch(port, key, body)
            batch_first = _first_start(
                pg_url, "batch_id = %s", (uuid.UUID(answer["id"]).hex,), began
            )
        finally:
            if worker is not None:
                worker.stop()
            server.process.stop()
            stack.close()

    rows = [
        {
            "way": f"{args.clients} clients, single POST /v1/jobs (baseline)",
            "jobs": len(singles),
            "jobs/s": single_rate,
            "p50 ms": percentile(singles, 50),
            "first job started after s": single_first,
            "rate / baseline": 1.0,
        },
        {
            "way": f"one POST /v1/batches of {args.lines:,} lines (JSONL)",
            "jobs": args.lines * len(batch_times),
            "jobs/s": batch_rate,
            "p50 ms": 1000 * sorted(batch_times)[len(batch_times) // 2],
            "first job started after s": batch_first,
            "rate / baseline": batch_rate / single_rate,
        },
    ]
    print_table(
        f"Batch ingest ({args.rounds} turns each; batch answered in "
        f"{', '.join(f'{t:.2f}' for t in batch_times)} s; with a worker, the timed batch "
        f"answered in {took:.2f} s; gunicorn 2 x 256 gthread; {os.cpu_count()} CPUs)",
        rows,
        list(rows[0]),
    )


if __name__ == "__main__":
    main()
