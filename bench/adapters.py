"""Warm weights: adapter and model loads, throughput, latency and a rare tenant's wait,
with the fair choice preferring warm jobs and with warmth ignored, in one run.

    .venv/bin/python -m bench.adapters [--jobs 120] [--steps 2]
        [--memory-adapters 4] [--device-adapters 2]

Two CPU workers on one queue serving 3 tiny models (distinct weights), each worker
holding one loaded model at a time (DIFFQ_WORKER_MODEL_BYTES: room for one model's
weights), 4 adapters' bytes in memory (DIFFQ_ADAPTER_CACHE_BYTES) and 2 adapters' bytes
in each pipeline (DIFFQ_ADAPTER_DEVICE_BYTES). The workload is submitted at once: each
job's model is drawn Zipf(1.1) over the 3 models and its adapter Zipf(1.1) over 20, from
3 busy tenants; a fourth, rare tenant sends every 10th job with the rarest adapter.
Baseline: the same workload (same draws) with DIFFQ_WARM_MAX_SKIPS=0, in the same
invocation. Loads are counted from the workers' logs: models loaded after start,
adapters read from the store, adapters loaded into a pipeline.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from datetime import datetime
from pathlib import Path

import requests

from app.config import load_settings
from bench.report import percentile, print_table
from testbed.jobs import auth, submit, wait_terminal
from testbed.processes import ApiServer, start_worker
from testbed.stack import start_stack

MODELS = ("m0", "m1", "m2")
ADAPTERS = 20
MODELS_TOML = """\
default_model = "m0"
{tables}"""
TABLE = """
[models.{name}]
path = "{path}"
queue = "gpu.pool"
dtype = "float32"
max_width = 64
max_height = 64
default_width = 64
default_height = 64
default_steps = 2
lora_family = "tiny"
max_loras = 1
soft_time_limit = 60
time_limit = 90
"""


def _zipf(count: int, rng: random.Random, s: float = 1.1) -> int:
    weights = [1 / (rank + 1) ** s for rank in range(count)]
    return rng.choices(range(count), weights)[0]


def workload(jobs: int, seed: int = 7) -> list[tuple[str, int, int]]:
    """(tenant, model index, adapter index) per job, in submit order."""
    rng = random.Random(seed)
    drawn = []
    for index in range(jobs):
        if index % 10 == 9:
            drawn.append(("rare", _zipf(3, rng), ADAPTERS - 1))
        else:
            drawn.append((f"busy{index % 3}", _zipf(3, rng), _zipf(ADAPTERS - 1, rng)))
    return drawn


def _key(database_url: str, tenant: str) -> str:
    from app.db.session import Database
    from app.keys import create_key, get_or_create_tenant

    db = Database(database_url, pool_size=1)
    with db.session() as session:
        key = create_key(session, get_or_create_tenant(session, tenant), "bench")
    db.dispose()
    return key


def _run(
    warm: bool,
    draws: list,
    steps: int,
    lora_files: list[bytes],
    models_dir: Path,
    budgets: dict[str, str],
    max_skips: int,
) -> dict:
    from kombu import Connection

    from app.broker.topology import declare_topology

    env = {
        "DIFFQ_WARM_MAX_SKIPS": str(max_skips) if warm else "0",
        "DIFFQ_PROGRESS_INTERVAL": "0.5",
        **budgets,
    }
    with tempfile.TemporaryDirectory() as tmp:
        models_file = Path(tmp) / "pool.toml"
        tables = "".join(TABLE.format(name=n, path=models_dir / n) for n in MODELS)
        models_file.write_text(MODELS_TOML.format(tables=tables))
        stack = start_stack(Path(tmp), {**env, "DIFFQ_MODELS_FILE": str(models_file)})
        api, workers = None, []
        try:
            with Connection(stack.broker_url) as conn:
                declare_topology(conn, ["gpu.pool"])
            api = ApiServer(stack.env, stack.logs, name="bench-api").start()
            workers = [
                start_worker(stack.env, stack.logs, f"bench-w{i}", models=",".join(MODELS))
                for i in range(2)
            ]
            started_loads = [w.count(r"model \S+ loaded on") for w in workers]
            keys = {t: _key(stack.database_url, t) for t in {d[0] for d in draws}}
            adapter_ids: dict[tuple[str, int], str] = {}
            for tenant, key in keys.items():
                for index, data in enumerate(lora_files):
                    made = requests.post(
                        f"{api.url}/v1/adapters",
                        files={"file": ("a.safetensors", data)},
                        data={"model": "m0"},
                        headers=auth(key),
                        timeout=30,
                    )
                    made.raise_for_status()
                    adapter_ids[(tenant, index)] = made.json()["id"]
            began = time.time()
            sent = []
            for n, (tenant, model, adapter) in enumerate(draws):
                job = submit(
                    api.url,
                    keys[tenant],
                    prompt=f"p{n}",
                    seed=n,
                    steps=steps,
                    model=MODELS[model],
                    loras=[{"id": adapter_ids[(tenant, adapter)], "scale": 0.8}],
                    cache=False,
                )
                sent.append((tenant, job["id"]))
            done = [(t, wait_terminal(api.url, keys[t], j, timeout=3600)) for t, j in sent]
            ended = time.time()

            def stamp(job, name):
                return datetime.fromisoformat(job[name]).timestamp()

            latency = [stamp(j, "finished_at") - stamp(j, "created_at") for _, j in done]
            rare_waits = [
                stamp(j, "started_at") - stamp(j, "created_at") for t, j in done if t == "rare"
            ]
            model_loads = sum(
                w.count(r"model \S+ loaded on") - s
                for w, s in zip(workers, started_loads, strict=True)
            )
            store_reads = sum(w.count(r"read from the store") for w in workers)
            pipeline_loads = sum(w.count(r"loaded into the pipeline") for w in workers)
            per100 = 100 / len(draws)
            return {
                "warmth": "preferred" if warm else "ignored (baseline)",
                "model loads/100": model_loads * per100,
                "adapter loads/100": pipeline_loads * per100,
                "store reads/100": store_reads * per100,
                "images/s": len(done) / (ended - began),
                "p50 s": percentile(latency, 50),
                "p99 s": percentile(latency, 99),
                "rare wait max s": max(rare_waits),
                "all done": all(j["status"] == "succeeded" for _, j in done),
            }
        finally:
            for process in (*workers, api):
                if process is not None:
                    process.stop()
            stack.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=120)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--memory-adapters", type=int, default=4, help="adapters' bytes in memory")
    parser.add_argument(
        "--device-adapters", type=int, default=2, help="adapters' bytes per pipeline"
    )
    parser.add_argument(
        "--max-skips", type=int, default=load_settings({"DIFFQ_SECRET_KEY": "-"}).warm_max_skips
    )
    args = parser.parse_args()
    from safetensors.torch import load

    from app.catalog import tiny_spec
    from workers.footprint import estimate_bytes
    from workers.tiny import build_tiny_lora, build_tiny_model

    draws = workload(args.jobs)
    lora_files = [build_tiny_lora(seed) for seed in range(ADAPTERS)]
    on_device = sum(t.numel() * 4 for t in load(lora_files[0]).values())  # float32
    with tempfile.TemporaryDirectory() as tmp:
        models_dir = Path(tmp)
        for seed, name in enumerate(MODELS):
            build_tiny_model(models_dir / name, seed=seed)
        model_bytes = estimate_bytes(tiny_spec(models_dir / MODELS[0]), 4)
        budgets = {
            "DIFFQ_WORKER_MODEL_BYTES": str(int(model_bytes * 1.5)),  # one model, not two
            "DIFFQ_ADAPTER_CACHE_BYTES": str(args.memory_adapters * len(lora_files[0])),
            "DIFFQ_ADAPTER_DEVICE_BYTES": str(args.device_adapters * on_device),
        }
        rows = [
            _run(warm, draws, args.steps, lora_files, models_dir, budgets, args.max_skips)
            for warm in (False, True)
        ]
    base = rows[0]
    ratios = {
        "model loads ratio": "model loads/100",
        "adapter loads ratio": "adapter loads/100",
        "rare wait max ratio": "rare wait max s",
        "images ratio": "images/s",
    }
    for row in rows:
        for name, column in ratios.items():
            row[name] = row[column] / base[column] if base[column] else float("nan")
    # Each model-adapter pair the run names must be loaded into a pipeline at least once.
    pairs = len({(model, adapter) for _, model, adapter in draws})
    print_table(
        f"Warm weights: {args.jobs} jobs (Zipf over 3 models and {ADAPTERS} adapters), "
        f"2 CPU workers, tiny model, {args.steps} steps; each worker holds 1 model, "
        f"{args.memory_adapters} adapters in memory, {args.device_adapters} per pipeline; "
        f"DIFFQ_WARM_MAX_SKIPS={args.max_skips}; {pairs} model-adapter pairs named "
        f"(the floor of adapter loads: {100 * pairs / len(draws):.2f}/100)",
        rows,
        [
            "warmth",
            "model loads/100",
            "adapter loads/100",
            "store reads/100",
            "images/s",
            "p50 s",
            "p99 s",
            "rare wait max s",
            "model loads ratio",
            "adapter loads ratio",
            "rare wait max ratio",
            "images ratio",
            "all done",
        ],
    )


if __name__ == "__main__":
    main()
