"""The hold on real workers: model loads, waits and the rarest model's longest wait with
the hold (DIFFQ_WARM_HOLD_SECONDS) and without it (today's warm routing, LRU unloading),
on the same arrivals, in one run.

    .venv/bin/python -m bench.hold [--jobs 240] [--interval 0.4] [--hold 20] [--seed 7]

Two variants on the same arrivals: no hold (DIFFQ_WARM_HOLD_SECONDS=0, the baseline:
today's warm routing, LRU unloading) and the hold (`--hold` seconds), with which a
worker unloads a second copy first, then the model least wanted x slowest to reload
(workers/unload.py).

Two CPU workers on one queue serving 6 tiny models (distinct weights), each holding 2
loaded at a time (DIFFQ_WORKER_MAX_MODELS=2), as on the residency simulation
(bench/residency.py). Each job's model is drawn Zipf(1.1) over the 6; jobs arrive one
at a time, exponentially spaced with a mean of `--interval` seconds, through the API.
Loads are counted from the workers' logs (models loaded after start); a wait runs from
a job's creation to its start.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

from bench.adapters import _key
from bench.report import percentile, print_table
from testbed.jobs import submit, wait_terminal
from testbed.processes import ApiServer, start_worker
from testbed.stack import start_stack

MODELS = tuple(f"m{i}" for i in range(6))
QUEUE = "gpu.hold-bench"
TABLE = """
[models.{name}]
path = "{path}"
queue = "{queue}"
dtype = "float32"
max_width = 64
max_height = 64
default_width = 64
default_height = 64
default_steps = 2
soft_time_limit = 60
time_limit = 90
"""


def workload(jobs: int, interval: float, seed: int) -> list[tuple[float, int]]:
    """(seconds after the start, model index) per job, in arrival order."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) ** 1.1 for rank in range(len(MODELS))]
    at, drawn = 0.0, []
    for _ in range(jobs):
        at += rng.expovariate(1 / interval)
        drawn.append((at, rng.choices(range(len(MODELS)), weights)[0]))
    return drawn


def loads_lru(sequence: list[int], slots: int) -> int:
    """Loads of one cache of `slots` models, least recently used out."""
    held: list[int] = []
    loads = 0
    for model in sequence:
        if model in held:
            held.remove(model)
        else:
            loads += 1
            if len(held) >= slots:
                held.pop(0)
        held.append(model)
    return loads


def loads_fewest(sequence: list[int], slots: int) -> int:
    """Loads of one cache of `slots` models that knows the future and unloads the model
    needed furthest ahead (Belady's): the fewest any policy can make."""
    held: set[int] = set()
    loads = 0
    for at, model in enumerate(sequence):
        if model in held:
            continue
        loads += 1
        if len(held) >= slots:
            ahead = sequence[at + 1 :]
            held.remove(max(held, key=lambda m: ahead.index(m) if m in ahead else len(ahead)))
        held.add(model)
    return loads


def bounds(draws: list, per_worker: int, workers: int) -> list[dict]:
    """What the arrivals cost in loads per 100 jobs, for reference: each worker's slots
    alone (what two workers that hold the same models amount to) and the fleet's slots
    as one cache, by LRU and by the fewest possible."""
    sequence = [model for _, model in draws]
    rows = []
    for name, slots in (("one worker's", per_worker), ("the fleet's", per_worker * workers)):
        for policy, count in (("LRU", loads_lru), ("fewest possible", loads_fewest)):
            rows.append(
                {
                    "cache": f"{name} {slots} slots as one cache, {policy}",
                    "loads/100 jobs": 100 * count(sequence, slots) / len(sequence),
                }
            )
    return rows


def _run(hold: float, draws: list, models_dir: Path) -> dict:
    from kombu import Connection

    from app.broker.topology import declare_topology

    env = {
        "DIFFQ_WARM_HOLD_SECONDS": str(hold),
        "DIFFQ_WORKER_MAX_MODELS": "2",
        "DIFFQ_PROGRESS_INTERVAL": "0.5",
    }
    with tempfile.TemporaryDirectory() as tmp:
        models_file = Path(tmp) / "pool.toml"
        tables = "".join(TABLE.format(name=n, path=models_dir / n, queue=QUEUE) for n in MODELS)
        models_file.write_text(f'default_model = "m0"\n{tables}')
        stack = start_stack(Path(tmp), {**env, "DIFFQ_MODELS_FILE": str(models_file)})
        api, workers = None, []
        try:
            with Connection(stack.broker_url) as conn:
                declare_topology(conn, [QUEUE])
            api = ApiServer(stack.env, stack.logs, name="bench-api").start()
            workers = [
                start_worker(stack.env, stack.logs, f"bench-hold{i}", models=",".join(MODELS))
                for i in range(2)
            ]
            started_loads = [w.count(r"model \S+ loaded on") for w in workers]
            key = _key(stack.database_url, "bench")
            began = time.monotonic()
            sent = []
            for n, (at, model) in enumerate(draws):
                time.sleep(max(0.0, began + at - time.monotonic()))
                job = submit(api.url, key, prompt=f"p{n}", seed=n, model=MODELS[model], cache=False)
                sent.append((model, job["id"]))
            done = [(m, wait_terminal(api.url, key, j, timeout=3600)) for m, j in sent]

            def stamp(job, name):
                return datetime.fromisoformat(job[name]).timestamp()

            waits = [(m, stamp(j, "started_at") - stamp(j, "created_at")) for m, j in done]
            counts = Counter(model for _, model in draws)
            rarest = min(counts, key=lambda m: (counts[m], -m))
            loads = sum(
                w.count(r"model \S+ loaded on") - s
                for w, s in zip(workers, started_loads, strict=True)
            )
            held = sum(w.count(r"waits: its jobs' models are loaded") for w in workers)
            handed = sum(w.count(r": to the idle worker that holds its model") for w in workers)
            all_waits = [w for _, w in waits]
            return {
                "hold": "none" if hold <= 0 else f"{hold:g} s",
                "loads/100 jobs": 100 * loads / len(draws),
                "claims that waited": held,
                "handed back": handed,
                "p50 wait s": percentile(all_waits, 50),
                "p99 wait s": percentile(all_waits, 99),
                "rarest model": f"{MODELS[rarest]} ({counts[rarest]} jobs)",
                "rarest longest wait s": max(w for m, w in waits if m == rarest),
                "all done": all(j["status"] == "succeeded" for _, j in done),
            }
        finally:
            for process in (*workers, api):
                if process is not None:
                    process.stop()
            stack.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=240)
    parser.add_argument("--interval", type=float, default=0.4, help="mean seconds between jobs")
    parser.add_argument("--hold", type=float, default=20.0, help="DIFFQ_WARM_HOLD_SECONDS")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    from workers.tiny import build_tiny_model

    draws = workload(args.jobs, args.interval, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        models_dir = Path(tmp)
        for seed, name in enumerate(MODELS):
            build_tiny_model(models_dir / name, seed=seed)
        rows = [_run(hold, draws, models_dir) for hold in (0.0, args.hold)]
    base = rows[0]
    for row in rows:
        for name, column in {
            "loads ratio": "loads/100 jobs",
            "p50 ratio": "p50 wait s",
            "p99 ratio": "p99 wait s",
            "rarest wait ratio": "rarest longest wait s",
        }.items():
            row[name] = row[column] / base[column] if base[column] else float("nan")
    print_table(
        f"The hold on real workers: {args.jobs} jobs, Zipf(1.1) over {len(MODELS)} tiny "
        f"models, one every {args.interval} s on average (seed {args.seed}); 2 CPU workers "
        "holding 2 models each; baseline: no hold (warm routing, LRU), same arrivals",
        rows,
        [
            "hold",
            "loads/100 jobs",
            "claims that waited",
            "handed back",
            "p50 wait s",
            "p99 wait s",
            "rarest model",
            "rarest longest wait s",
            "loads ratio",
            "p50 ratio",
            "p99 ratio",
            "rarest wait ratio",
            "all done",
        ],
    )
    reference = bounds(draws, per_worker=2, workers=2)
    for row in reference:
        row["ratio to the baseline"] = row["loads/100 jobs"] / base["loads/100 jobs"]
    print_table(
        "The same arrivals without workers: loads a cache of those slots would make",
        reference,
        ["cache", "loads/100 jobs", "ratio to the baseline"],
    )


if __name__ == "__main__":
    main()
