"""What progress reporting costs a generation: the same runs with and without it.

    .venv/bin/python -m bench.progress_overhead [--rounds 10] [--steps 30]

Baseline: the tiny pipeline with a no-op step callback. Then the worker's reporter
writing to a real PostgreSQL row (a conditional UPDATE, a NOTIFY and a commit per write)
at the default interval (0.25 s) and at every step. Variants are interleaved round by
round so that machine noise hits them alike.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

from bench.report import print_table, summarize
from testbed import services


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()

    from app.catalog import tiny_spec
    from app.db.migrate import upgrade
    from app.db.session import Database
    from app.jobs import service, transitions
    from app.jobs.states import Priority
    from app.keys import get_or_create_tenant
    from testbed.factories import generate_one, job_request
    from workers.pipelines import load_model, warm_up
    from workers.progress import ProgressReporter
    from workers.tiny import build_tiny_model

    name = f"diffq_bench_{uuid.uuid4().hex[:8]}"
    url = services.create_database(name)
    try:
        upgrade(url)
        db = Database(url, pool_size=2)
        with db.session() as session:
            tenant = get_or_create_tenant(session, "bench")
            job = service.create_job(
                session,
                tenant.id,
                model="tiny",
                queue="gpu.tiny",
                priority=Priority.NORMAL,
                request=job_request(model="tiny", steps=args.steps),
                metadata=None,
            )
        with db.session() as session:
            transitions.claim_job(
                session,
                job.id,
                owner="bench",
                redelivered=False,
                max_attempts=10**6,
                lease_seconds=600,
            )

        def write(progress) -> bool:
            with db.session() as session:
                return transitions.record_progress(
                    session, job.id, owner="bench", progress=progress, lease_seconds=600
                )

        with tempfile.TemporaryDirectory() as tmp:
            model = load_model(tiny_spec(build_tiny_model(Path(tmp) / "tiny")), "cpu")
        warm_up(model)
        request = job_request(
            model.spec, prompt="a red fox", width=64, height=64, steps=args.steps, seed=1
        )
        variants = {
            "no progress (baseline)": lambda: (lambda step, total: True, None),
            "progress every 0.25 s (default)": lambda: _reporter(ProgressReporter, write, 0.25),
            "progress every step": lambda: _reporter(ProgressReporter, write, 0.0),
        }
        samples: dict[str, list[float]] = {name: [] for name in variants}
        writes: dict[str, list[int]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, make in variants.items():
                on_step, reporter = make()
                started = time.perf_counter()
                generate_one(model, request, on_step=on_step)
                if reporter is not None:
                    reporter.stage("uploading", args.steps, args.steps)  # as the worker does
                samples[name].append((time.perf_counter() - started) * 1000)
                writes[name].append(reporter.writes if reporter else 0)
        db.dispose()
    finally:
        services.drop_database(name)

    base = summarize(samples["no progress (baseline)"])["p50"]
    rows = []
    for name, values in samples.items():
        row = {"variant": name, **summarize(values)}
        row["writes/run"] = sum(writes[name]) / len(writes[name])
        row["p50 / baseline"] = row["p50"] / base
        rows.append(row)
    print_table(
        f"Generation with progress writes, ms ({args.rounds} runs each, 64x64, "
        f"{args.steps} steps, tiny model, CPU; PostgreSQL)",
        rows,
        ["variant", "n", "p50", "p90", "mean", "writes/run", "p50 / baseline"],
    )


def _reporter(cls, write, interval):
    reporter = cls(write, interval=interval)
    return reporter.step, reporter


if __name__ == "__main__":
    main()
