"""How many `Prefer: wait` requests one API process holds, and what they cost.

    .venv/bin/python -m bench.sync_wait [--waits 100,200] [--threads 256] [--slots 128]

One gunicorn process (gthread). For each W: W clients POST /v1/jobs with
`Prefer: wait=60` at once, on a model no worker serves (the jobs stay queued). Past
DIFFQ_WAIT_SLOTS the API answers 202 at once instead of waiting. The clients are one
tenant, whose held requests are capped too (DIFFQ_MAX_TENANT_STREAMS, 16 by default):
the bench lifts that cap and the process's stream cap, to measure the process itself.
With every job made, the table reads the process's RSS and threads and GET /healthz's
latency; then all W jobs are failed in one transaction and the held requests' answers
are timed.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from bench.report import percentile, print_table
from bench.sse_streams import _gunicorn_worker_pid, _health_ms, _rss_mb, _threads
from bench.submit_latency import _make_key
from testbed.jobs import auth
from testbed.processes import ApiServer
from testbed.stack import start_stack


def _tenant_jobs(database_url: str, key: str) -> list:
    from sqlalchemy import select

    from app.db.models.jobs import Job
    from app.db.models.tenants import ApiKey
    from app.db.session import Database
    from app.keys import key_id_of

    db = Database(database_url, pool_size=1)
    with db.session() as session:
        tenant = session.scalar(select(ApiKey.tenant_id).where(ApiKey.key_id == key_id_of(key)))
        ids = list(session.scalars(select(Job.id).where(Job.tenant_id == tenant)))
    db.dispose()
    return ids


def _fail_all(database_url: str, ids: list) -> float:
    from app.db.session import Database
    from app.jobs import transitions
    from app.jobs.states import ErrorCode

    db = Database(database_url, pool_size=1)
    with db.session() as session:
        for job_id in ids:
            transitions.finish_failed(session, job_id, code=ErrorCode.INTERNAL, message="bench")
        started = time.perf_counter()  # the NOTIFYs go out with this commit
    db.dispose()
    return started


def _measure(api: ApiServer, database_url: str, waits: int) -> dict:
    key = _make_key(database_url)
    answers: list[tuple[int, float]] = []
    lock = threading.Lock()

    def one() -> None:
        response = requests.post(
            f"{api.url}/v1/jobs",
            json={"prompt": "wait", "model": "tiny-b", "steps": 2},
            headers={**auth(key), "Prefer": "wait=60"},
            timeout=120,
        )
        with lock:
            answers.append((response.status_code, time.perf_counter()))

    pool = ThreadPoolExecutor(max_workers=waits)
    started = time.perf_counter()
    futures = [pool.submit(one) for _ in range(waits)]
    while len(ids := _tenant_jobs(database_url, key)) < waits:
        time.sleep(0.2)
    time.sleep(1.0)  # the last requests reach their wait
    all_made_s = time.perf_counter() - started
    with lock:
        at_once = sum(1 for status, _ in answers if status == 202)
    held = waits - at_once
    pid = _gunicorn_worker_pid(api.pid)
    rss, threads = _rss_mb(pid), _threads(pid)
    health = _health_ms(api.url, 30)
    released = _fail_all(database_url, ids)
    for future in futures:
        future.result()
    pool.shutdown()
    late = [(t - released) * 1000 for status, t in answers if status == 200]
    return {
        "waits": waits,
        "held": held,
        "202 at once": at_once,
        "all made (s)": all_made_s,
        "worker RSS MB": rss,
        "threads": threads,
        "healthz p50 ms": health,
        "answer p50 ms": percentile(late, 50),
        "answer max ms": max(late) if late else float("nan"),
        "answered 200": len(late),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waits", default="100,200")
    parser.add_argument("--threads", type=int, default=256)
    parser.add_argument("--slots", type=int, default=128)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        extra = {
            "DIFFQ_MAX_QUEUED": "0",
            "DIFFQ_WAIT_SLOTS": str(args.slots),
            "DIFFQ_MAX_TENANT_STREAMS": "0",  # one tenant here: the process's limits only
            "DIFFQ_MAX_STREAMS": "0",
        }
        stack = start_stack(Path(tmp), {**extra, "DIFFQ_SSE_KEEPALIVE": "15"})
        api = ApiServer(stack.env, stack.logs, name="bench-api", threads=args.threads)
        try:
            api.start()
            idle = _health_ms(api.url)
            idle_rss = _rss_mb(_gunicorn_worker_pid(api.pid))
            for count in (int(n) for n in args.waits.split(",")):
                rows.append(_measure(api, stack.database_url, count))
        finally:
            api.stop()
            stack.close()
    print_table(
        f"Prefer: wait on one API process (gthread, {args.threads} threads, "
        f"DIFFQ_WAIT_SLOTS={args.slots}); idle: healthz p50 {idle:.2f} ms, RSS {idle_rss:.0f} MB",
        rows,
        list(rows[0]),
    )


if __name__ == "__main__":
    main()
