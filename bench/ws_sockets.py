"""How many WebSockets one API process holds, their memory, and how fast they fan out.

    .venv/bin/python -m bench.ws_sockets [--sockets 100,1000] [--threads 1100]

One gunicorn process (gthread). For each N: N running jobs, one socket on each (the
`websockets` asyncio client), each waiting for its first event; then the process's RSS
and threads and GET /healthz's latency are read, all N jobs' progress is updated in one
transaction and each socket's receipt of the new event timed; last, all N jobs fail in
one transaction and every socket must be closed with 4001 (failed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from bench.report import percentile, print_table
from bench.sse_streams import _health_ms, _push_progress, _running_jobs
from bench.submit_latency import _make_key
from bench.sync_wait import _fail_all
from testbed.processes import ApiServer
from testbed.socket_fleet import gunicorn_worker_pid, rss_kib, threads_of
from testbed.stack import start_stack

MARKER_STEP = 777


async def _measure(api: ApiServer, database_url: str, count: int, idle_kib: int) -> dict:
    from websockets.asyncio.client import connect

    key, ids = _running_jobs(database_url, count)
    gate = asyncio.Semaphore(50)
    started = time.perf_counter()

    async def open_one(job_id):
        async with gate:
            ws = await connect(
                f"ws://127.0.0.1:{api.port}/v1/jobs/{job_id}/ws",
                additional_headers={"Authorization": f"Bearer {key}"},
                open_timeout=120,
                max_queue=None,
            )
            await asyncio.wait_for(ws.recv(), 120)
            return ws

    sockets = await asyncio.gather(*(open_one(job_id) for job_id in ids))
    open_s = time.perf_counter() - started
    pid = gunicorn_worker_pid(api.pid)
    loop = asyncio.get_running_loop()
    health = await loop.run_in_executor(None, _health_ms, api.url, 30)
    held_kib, threads = rss_kib(pid), threads_of(pid)

    async def marker(ws) -> float:
        while True:
            message = json.loads(await ws.recv())
            if message["event"] == "progress" and message["data"]["step"] == MARKER_STEP:
                return time.perf_counter()

    waiting = [asyncio.create_task(marker(ws)) for ws in sockets]
    pushed = await loop.run_in_executor(None, _push_progress, database_url, ids, MARKER_STEP)
    got = await asyncio.wait_for(asyncio.gather(*waiting), 300)
    fanout = [(t - pushed) * 1000 for t in got]

    async def close_code(ws) -> int | None:
        try:
            async for _ in ws:
                pass
        except Exception:  # noqa: BLE001 - the code is read below either way
            pass
        return ws.close_code

    closing = [asyncio.create_task(close_code(ws)) for ws in sockets]
    await loop.run_in_executor(None, _fail_all, database_url, ids)
    codes = await asyncio.wait_for(asyncio.gather(*closing), 300)
    await asyncio.sleep(2)
    return {
        "sockets": count,
        "all open (s)": open_s,
        "worker RSS MB": held_kib / 1024,
        "KiB / socket": (held_kib - idle_kib) / count,
        "threads": threads,
        "healthz p50 ms": health,
        "fan-out p50 ms": percentile(fanout, 50),
        "fan-out p99 ms": percentile(fanout, 99),
        "closed 4001": sum(1 for c in codes if c == 4001),
        "threads after": threads_of(pid),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sockets", default="100,1000")
    parser.add_argument("--threads", type=int, default=1100)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(Path(tmp), {"DIFFQ_SSE_KEEPALIVE": "15"})  # the default
        api = ApiServer(stack.env, stack.logs, name="bench-api", threads=args.threads)
        try:
            api.start()
            _make_key(stack.database_url)
            idle = _health_ms(api.url)
            idle_kib = rss_kib(gunicorn_worker_pid(api.pid))
            for count in (int(n) for n in args.sockets.split(",")):
                rows.append(asyncio.run(_measure(api, stack.database_url, count, idle_kib)))
        finally:
            api.stop()
            stack.close()
    print_table(
        f"WebSockets on one API process (gthread, {args.threads} threads); idle: healthz p50 "
        f"{idle:.2f} ms, RSS {idle_kib / 1024:.0f} MB",
        rows,
        list(rows[0]),
    )


if __name__ == "__main__":
    main()
