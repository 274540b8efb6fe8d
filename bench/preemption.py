"""How long urgent jobs wait behind a fleet of long jobs, without and with preemption.

    .venv/bin/python -m bench.preemption [--workers 2] [--long 6] [--long-seconds 30]
                                         [--urgent 8] [--every 7]

Real processes on a private stack (PostgreSQL, RabbitMQ, S3): the API, the relay (every
0.5 s) and `--workers` CPU workers serving one tiny model with checkpoints. A fleet of
`--long` `low` jobs, each calibrated to about `--long-seconds` of denoising, fills every
worker; then an urgent `high` job of 20 steps arrives every `--every` seconds. Each
urgent job's wait is its start minus its submit. Baseline: the same run with
DIFFQ_PREEMPT_AFTER=0 (no preemption), in the same invocation; the ratio is with /
without. The long jobs' summed run time says what preemption costs them (a checkpoint,
a reload and a resume each time).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench.report import percentile, print_table
from testbed.jobs import submit, wait_terminal
from testbed.processes import ApiServer, ManagedProcess, start_worker
from testbed.stack import start_stack

MODELS = """
default = "long"

[models.long]
path = "{tiny}"
queue = "gpu.long"
dtype = "float32"
min_size = 32
max_width = 256
max_height = 256
max_pixels = 65536
default_width = 256
default_height = 256
max_steps = 999
default_steps = 20
checkpoint_seconds = 5
soft_time_limit = 600
time_limit = 900
"""


def _key(database_url: str) -> str:
    from app.db.session import Database
    from app.keys import create_key, get_or_create_tenant

    db = Database(database_url, pool_size=1)
    with db.session() as session:
        key = create_key(session, get_or_create_tenant(session, "bench"), "bench")
    db.dispose()
    return key


def _seconds(job: dict, field: str) -> float:
    return datetime.fromisoformat(job[field]).timestamp()


def _run(preempt: bool, args, steps: int | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        stack = start_stack(workdir / "stack")
        models = workdir / "models.toml"
        models.write_text(MODELS.format(tiny=stack.tiny_model))
        env = {
            **stack.env,
            "DIFFQ_MODELS_FILE": str(models),
            "DIFFQ_PREEMPT_AFTER": "1" if preempt else "0",
            "DIFFQ_PREEMPT_MIN_LEFT": "3",
            "DIFFQ_MAX_PREEMPTIONS": "100",
            "DIFFQ_SHUTDOWN_FINISH": "1",
        }
        processes: list[ManagedProcess] = []
        try:
            api = ApiServer(env, stack.logs, name="bench-api").start()
            processes.append(api)
            relay = ManagedProcess(
                "bench-relay",
                [sys.executable, "-m", "cli", "relay", "--interval", "0.5"],
                env,
                stack.logs,
            ).start()
            processes.append(relay)
            for i in range(args.workers):
                processes.append(start_worker(env, stack.logs, f"bench-w{i}", models="long"))
            key = _key(stack.database_url)
            size = {"width": 256, "height": 256}
            if steps is None:  # calibrate: a long job of about --long-seconds
                probe = submit(api.url, key, prompt="probe", steps=400, seed=1, **size)
                done = wait_terminal(api.url, key, probe["id"], timeout=600)
                per_step = (_seconds(done, "finished_at") - _seconds(done, "started_at")) / 400
                steps = min(999, max(50, round(args.long_seconds / per_step)))
            long_jobs = [
                submit(
                    api.url, key, prompt=f"long {i}", steps=steps, seed=i, priority="low", **size
                )
                for i in range(args.long)
            ]
            time.sleep(args.every)  # every worker busy with a long job
            urgent = []
            for i in range(args.urgent):
                urgent.append(
                    submit(api.url, key, prompt=f"u{i}", steps=20, seed=i, priority="high", **size)
                )
                time.sleep(args.every)
            urgent_done = [wait_terminal(api.url, key, j["id"], timeout=3600) for j in urgent]
            long_done = [wait_terminal(api.url, key, j["id"], timeout=7200) for j in long_jobs]
        finally:
            for process in reversed(processes):
                process.stop()
            stack.close()
    waits = [_seconds(j, "started_at") - _seconds(j, "created_at") for j in urgent_done]
    resumes = sum(
        len((j["result"] or {}).get("manifest", {}).get("resumes", [])) for j in long_done
    )
    return {
        "preemption": "on" if preempt else "off",
        "steps": steps,
        "urgent p50 s": percentile(waits, 50),
        "urgent p99 s": percentile(waits, 99),
        "urgent max s": max(waits),
        "long resumes": resumes,
        "long all ok": all(j["status"] == "succeeded" for j in long_done + urgent_done),
        "long last end s": max(_seconds(j, "finished_at") for j in long_done)
        - min(_seconds(j, "created_at") for j in long_done),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--long", type=int, default=6)
    parser.add_argument("--long-seconds", type=float, default=30.0)
    parser.add_argument("--urgent", type=int, default=8)
    parser.add_argument("--every", type=float, default=7.0)
    args = parser.parse_args()
    base = _run(False, args, None)
    rows = [base, _run(True, args, base["steps"])]
    for row in rows:
        row["p50 ratio"] = row["urgent p50 s"] / base["urgent p50 s"]
        row["p99 ratio"] = row["urgent p99 s"] / base["urgent p99 s"]
        row["makespan ratio"] = row["long last end s"] / base["long last end s"]
    print_table(
        f"Urgent jobs' wait behind {args.long} long jobs (~{args.long_seconds:.0f} s each, "
        f"{args.workers} CPU workers, tiny model 256x256; {args.urgent} urgent jobs of 20 "
        f"steps, one every {args.every:.0f} s)",
        rows,
        [
            "preemption",
            "steps",
            "urgent p50 s",
            "urgent p99 s",
            "urgent max s",
            "p50 ratio",
            "p99 ratio",
            "long resumes",
            "long last end s",
            "makespan ratio",
            "long all ok",
        ],
    )


if __name__ == "__main__":
    main()
