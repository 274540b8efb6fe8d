"""Submit latency of the API on real PostgreSQL and RabbitMQ (publisher confirms on).

    .venv/bin/python -m bench.submit_latency [--requests 200]

Baselines from the same run: GET /healthz (the HTTP stack alone) and GET /v1/jobs/{id}
(authentication plus one read). Ratios are against /healthz's p50. The last two rows
come from a second API in the same run that counts every request against the per-key
rate limit (one upsert per request): compare them with the rows above them.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from bench.report import print_table, summarize
from testbed.jobs import auth
from testbed.processes import ApiServer
from testbed.stack import start_stack


def _timed(session: requests.Session, method: str, url: str, **kwargs) -> float:
    started = time.perf_counter()
    response = session.request(method, url, timeout=10, **kwargs)
    elapsed = (time.perf_counter() - started) * 1000
    assert response.status_code < 300, response.text
    return elapsed


def _make_key(database_url: str) -> str:
    from app.db.session import Database
    from app.keys import create_key, get_or_create_tenant

    db = Database(database_url, pool_size=1)
    with db.session() as session:
        key = create_key(session, get_or_create_tenant(session, "bench"), "bench")
    db.dispose()
    return key


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    n = args.requests

    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(Path(tmp))
        api = ApiServer(stack.env, stack.logs, name="bench-api", workers=2)
        api.args[api.args.index("--threads") + 1] = "16"
        # The same API with the per-key rate limit counted (a high limit: never refused).
        limited = ApiServer(
            {**stack.env, "DIFFQ_RATE_LIMIT": "1000000"}, stack.logs, "bench-api-rl", workers=2
        )
        limited.args[limited.args.index("--threads") + 1] = "16"
        try:
            api.start()
            limited.start()
            key = _make_key(stack.database_url)
            body = {"prompt": "benchmark", "steps": 2}
            session = requests.Session()
            for _ in range(20):  # warm both gunicorn processes and their pools
                _timed(session, "POST", f"{api.url}/v1/jobs", json=body, headers=auth(key))
            job_id = session.post(f"{api.url}/v1/jobs", json=body, headers=auth(key)).json()["id"]

            health = [_timed(session, "GET", f"{api.url}/healthz") for _ in range(n)]
            read = [
                _timed(session, "GET", f"{api.url}/v1/jobs/{job_id}", headers=auth(key))
                for _ in range(n)
            ]
            submit = [
                _timed(session, "POST", f"{api.url}/v1/jobs", json=body, headers=auth(key))
                for _ in range(n)
            ]

            for _ in range(20):
                _timed(session, "POST", f"{limited.url}/v1/jobs", json=body, headers=auth(key))
            read_rl = [
                _timed(session, "GET", f"{limited.url}/v1/jobs/{job_id}", headers=auth(key))
                for _ in range(n)
            ]
            submit_rl = [
                _timed(session, "POST", f"{limited.url}/v1/jobs", json=body, headers=auth(key))
                for _ in range(n)
            ]

            def one(_):
                with requests.Session() as own:
                    return _timed(own, "POST", f"{api.url}/v1/jobs", json=body, headers=auth(key))

            started = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                concurrent = list(pool.map(one, range(n)))
            throughput = n / (time.perf_counter() - started)
        finally:
            api.stop()
            limited.stop()
            stack.close()

    base = summarize(health)["p50"]
    rows = []
    for name, samples in (
        ("GET /healthz (baseline)", health),
        ("GET /v1/jobs/{id}", read),
        ("POST /v1/jobs", submit),
        (f"POST /v1/jobs x{args.concurrency} threads", concurrent),
        ("GET /v1/jobs/{id}, rate limit counted", read_rl),
        ("POST /v1/jobs, rate limit counted", submit_rl),
    ):
        row = {"request": name, **summarize(samples)}
        row["p50 / healthz"] = row["p50"] / base
        rows.append(row)
    print_table(
        f"Submit latency, ms ({n} requests each; gunicorn 2x16 gthread; PostgreSQL + RabbitMQ)",
        rows,
        ["request", "n", "p50", "p90", "p99", "max", "p50 / healthz"],
    )
    print(f"\nconcurrent submit throughput: {throughput:.0f} jobs/s")


if __name__ == "__main__":
    main()
