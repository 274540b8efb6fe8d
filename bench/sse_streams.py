"""How many Server-Sent Event streams one API process holds, and how fast it fans out.

    .venv/bin/python -m bench.sse_streams [--streams 100,500,1000] [--threads 1100]

One gunicorn process (gthread). For each N: open N streams on N running jobs, then
update all N jobs' progress in one transaction and time each stream's receipt of the
new event. Baseline from the same run: GET /healthz with no stream open; the ratio is
/healthz's latency while the N streams are open.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import requests

from bench.report import percentile, print_table
from bench.submit_latency import _make_key
from testbed.processes import ApiServer
from testbed.stack import start_stack


async def _open_stream(host, port, path, key, first_event: asyncio.Event, marker: str, got: dict):
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            text = line.decode()
            if text.startswith("event: status"):
                first_event.set()
            if marker in text and "marker" not in got:
                got["marker"] = time.perf_counter()
                return
    finally:
        writer.close()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def _health_ms(url: str, n: int = 50) -> float:
    session = requests.Session()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        session.get(f"{url}/healthz", timeout=10)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _running_jobs(database_url: str, count: int) -> tuple[str, list]:
    from app.db.session import Database
    from app.jobs import service, transitions
    from app.jobs.states import Priority
    from app.keys import create_key, get_or_create_tenant
    from testbed.factories import job_request

    db = Database(database_url, pool_size=2)
    ids = []
    with db.session() as session:
        tenant = get_or_create_tenant(session, f"sse-{count}")
        key = create_key(session, tenant, "bench")
        for _ in range(count):
            job = service.create_job(
                session,
                tenant.id,
                model="tiny",
                queue="gpu.tiny",
                priority=Priority.NORMAL,
                request=job_request(model="tiny", steps=1000),
                metadata=None,
            )
            ids.append(job.id)
    with db.session() as session:
        for job_id in ids:
            transitions.claim_job(
                session,
                job_id,
                owner="bench",
                redelivered=False,
                max_attempts=9,
                lease_seconds=3600,
            )
    db.dispose()
    return key, ids


def _push_progress(database_url: str, ids: list, marker_step: int) -> float:
    from app.db.session import Database
    from app.jobs import transitions

    db = Database(database_url, pool_size=1)
    with db.session() as session:
        for job_id in ids:
            transitions.record_progress(
                session,
                job_id,
                owner="bench",
                lease_seconds=3600,
                progress=transitions.progress_of("denoising", marker_step, 1000),
            )
        started = time.perf_counter()  # NOTIFYs are delivered on this commit
    db.dispose()
    return started


async def _measure(api: ApiServer, database_url: str, count: int) -> dict:
    key, ids = _running_jobs(database_url, count)
    host, port = "127.0.0.1", api.port
    marker_step = 777
    firsts = [asyncio.Event() for _ in ids]
    results = [{} for _ in ids]
    started = time.perf_counter()
    tasks = [
        asyncio.create_task(
            _open_stream(
                host, port, f"/v1/jobs/{job_id}/events", key, first, f'"step": {marker_step}', got
            )
        )
        for job_id, first, got in zip(ids, firsts, results, strict=True)
    ]
    await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), timeout=300)
    connect_s = time.perf_counter() - started
    worker_pid = _gunicorn_worker_pid(api.pid)
    loop = asyncio.get_running_loop()
    health = await loop.run_in_executor(None, _health_ms, api.url)
    rss, threads = _rss_mb(worker_pid), _threads(worker_pid)
    pushed = await loop.run_in_executor(None, _push_progress, database_url, ids, marker_step)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)
    fanout = [(got["marker"] - pushed) * 1000 for got in results]
    return {
        "streams": count,
        "all open (s)": connect_s,
        "worker RSS MB": rss,
        "threads": threads,
        "healthz p50 ms": health,
        "fan-out p50 ms": percentile(fanout, 50),
        "fan-out p99 ms": percentile(fanout, 99),
        "fan-out max ms": max(fanout),
    }


def _gunicorn_worker_pid(master: int) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == master:
                return int(entry.name)
    raise RuntimeError("no gunicorn worker found")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", default="100,500,1000")
    parser.add_argument("--threads", type=int, default=1100)
    args = parser.parse_args()
    counts = [int(n) for n in args.streams.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # The default keepalive; one tenant's streams, the stream caps lifted.
        caps_off = {"DIFFQ_MAX_TENANT_STREAMS": "0", "DIFFQ_MAX_STREAMS": "0"}
        stack = start_stack(Path(tmp), {"DIFFQ_SSE_KEEPALIVE": "15", **caps_off})
        api = ApiServer(stack.env, stack.logs, name="bench-api")
        api.args[api.args.index("--threads") + 1] = str(args.threads)
        try:
            api.start()
            _make_key(stack.database_url)
            idle = _health_ms(api.url)
            idle_rss = _rss_mb(_gunicorn_worker_pid(api.pid))
            for count in counts:
                row = asyncio.run(_measure(api, stack.database_url, count))
                row["healthz / idle"] = row["healthz p50 ms"] / idle
                rows.append(row)
        finally:
            api.stop()
            stack.close()
    print_table(
        f"SSE streams on one API process (gunicorn gthread, {args.threads} threads); "
        f"idle: healthz p50 {idle:.2f} ms, RSS {idle_rss:.0f} MB",
        rows,
        list(rows[0]),
    )


if __name__ == "__main__":
    main()
