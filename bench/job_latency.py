"""End-to-end time of tiny-model jobs against the same pipeline run bare, in one run.

    .venv/bin/python -m bench.job_latency [--jobs 20] [--steps 8]

Baseline: the tiny pipeline called directly in this process (same size, steps, seed).
End to end: POST -> queue -> worker -> S3 -> GET says succeeded (client polls every 100 ms).
The ratio is the price of the service around the model.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import requests

from bench.report import print_table, summarize
from bench.submit_latency import _make_key
from testbed.jobs import auth
from testbed.processes import ApiServer, start_worker
from testbed.stack import start_stack

POLL_SECONDS = 0.1


def _bare_pipeline_ms(model_dir: Path, params: dict, runs: int) -> list[float]:
    from app.catalog import tiny_spec
    from testbed.factories import generate_one, job_request
    from workers.pipelines import load_model, warm_up

    model = load_model(tiny_spec(model_dir), "cpu")
    warm_up(model)
    request = job_request(model.spec, **params)
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        generate_one(model, request)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    body = {"prompt": "a benchmark", "steps": args.steps, "width": 64, "height": 64, "seed": 1}

    with tempfile.TemporaryDirectory() as tmp:
        # Production's progress interval, not the tests' faster one.
        stack = start_stack(Path(tmp), {"DIFFQ_PROGRESS_INTERVAL": "0.25"})
        api = worker = None
        try:
            api = ApiServer(stack.env, stack.logs, name="bench-api").start()
            worker = start_worker(stack.env, stack.logs, "bench-worker", models="tiny")
            key = _make_key(stack.database_url)
            session = requests.Session()
            end_to_end, run, queue = [], [], []
            for i in range(args.jobs + 2):
                started = time.perf_counter()
                job = session.post(f"{api.url}/v1/jobs", json=body, headers=auth(key)).json()
                while job["status"] not in ("succeeded", "failed"):
                    time.sleep(POLL_SECONDS)
                    job = session.get(f"{api.url}/v1/jobs/{job['id']}", headers=auth(key)).json()
                assert job["status"] == "succeeded", job
                if i >= 2:  # the first two warm caches and pools
                    end_to_end.append((time.perf_counter() - started) * 1000)
                    run.append(job["metrics"]["run_seconds"] * 1000)
                    queue.append(job["metrics"]["queue_seconds"] * 1000)
            lines = [line for line in worker.log().splitlines() if "generate " in line]
            print("\n".join(lines[-3:]))
        finally:
            for process in (worker, api):
                if process is not None:
                    process.stop()
            stack.close()
        params = {**body, "guidance_scale": 7.5, "num_images": 1, "scheduler": "default"}
        bare = _bare_pipeline_ms(stack.tiny_model, params, args.jobs)

    base = summarize(bare)["p50"]
    rows = []
    for name, samples in (
        ("pipeline alone, in-process (baseline)", bare),
        ("queue wait (created -> started)", queue),
        ("worker run (started -> finished)", run),
        ("end to end (POST -> GET succeeded)", end_to_end),
    ):
        row = {"measure": name, **summarize(samples)}
        row["p50 / baseline"] = row["p50"] / base
        rows.append(row)
    print_table(
        f"Tiny-model job, ms ({args.jobs} jobs, 64x64, {args.steps} steps, PNG, CPU)",
        rows,
        ["measure", "n", "p50", "p90", "max", "p50 / baseline"],
    )


if __name__ == "__main__":
    main()
