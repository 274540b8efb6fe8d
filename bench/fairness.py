"""How long a small tenant waits behind a big tenant's burst, fair share off and on.

    .venv/bin/python -m bench.fairness [--burst 60] [--small 3] [--steps 2]

One worker on the tiny model. Tenant A submits a burst, then tenant B submits a few jobs;
for each B job the table shows its wait (submit to start) in seconds and in jobs of A
that started first. Baseline: the same run with DIFFQ_FAIR_SHARE=false (arrival order),
on the same machine, in the same invocation.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import datetime
from pathlib import Path

import requests

from bench.report import print_table
from testbed.jobs import auth, submit, wait_terminal
from testbed.processes import ApiServer, start_worker
from testbed.stack import start_stack


def _key(database_url: str, tenant: str) -> str:
    from app.db.session import Database
    from app.keys import create_key, get_or_create_tenant

    db = Database(database_url, pool_size=1)
    with db.session() as session:
        key = create_key(session, get_or_create_tenant(session, tenant), "bench")
    db.dispose()
    return key


def _run(fair: bool, burst: int, small: int, steps: int) -> dict:
    env = {"DIFFQ_FAIR_SHARE": "true" if fair else "false", "DIFFQ_PROGRESS_INTERVAL": "0.25"}
    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(Path(tmp), env)
        api = worker = None
        try:
            api = ApiServer(stack.env, stack.logs, name="bench-api").start()
            worker = start_worker(stack.env, stack.logs, "bench-worker", models="tiny")
            a, b = _key(stack.database_url, "A"), _key(stack.database_url, "B")
            body = {"steps": steps, "width": 64, "height": 64}
            a_jobs = [submit(api.url, a, prompt=f"a{i}", seed=i, **body) for i in range(burst)]
            b_jobs = []
            for i in range(small):
                b_jobs.append((time.time(), submit(api.url, b, prompt=f"b{i}", seed=i, **body)))
            b_done = [(t, wait_terminal(api.url, b, j["id"], timeout=3600)) for t, j in b_jobs]
            a_done = [wait_terminal(api.url, a, j["id"], timeout=3600) for j in a_jobs]
            a_starts = sorted(datetime.fromisoformat(j["started_at"]).timestamp() for j in a_done)
            waits = [datetime.fromisoformat(j["started_at"]).timestamp() - t for t, j in b_done]
            ahead = [
                sum(
                    1
                    for s in a_starts
                    if t <= s < datetime.fromisoformat(j["started_at"]).timestamp()
                )
                for t, j in b_done
            ]
            runs = [j["metrics"]["run_seconds"] for j in a_done]
            requests.get(f"{api.url}/v1/usage", headers=auth(a), timeout=10).raise_for_status()
            return {
                "fair share": "on" if fair else "off (baseline)",
                "B wait max s": max(waits),
                "B wait mean s": sum(waits) / len(waits),
                "A jobs first": max(ahead),
                "A job s": sum(runs) / len(runs),
                "all done": all(j["status"] == "succeeded" for j in a_done)
                and all(j["status"] == "succeeded" for _, j in b_done),
            }
        finally:
            for process in (worker, api):
                if process is not None:
                    process.stop()
            stack.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", type=int, default=60)
    parser.add_argument("--small", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    rows = [_run(fair, args.burst, args.small, args.steps) for fair in (False, True)]
    base = rows[0]["B wait max s"]
    for row in rows:
        row["ratio"] = row["B wait max s"] / base if base else float("nan")
    print_table(
        f"B's wait behind A's burst of {args.burst} ({args.small} B jobs, one worker, "
        f"tiny model, {args.steps} steps)",
        rows,
        [
            "fair share",
            "B wait max s",
            "B wait mean s",
            "A jobs first",
            "A job s",
            "ratio",
            "all done",
        ],
    )


if __name__ == "__main__":
    main()
