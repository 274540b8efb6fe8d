"""Which models a worker keeps loaded, and how jobs are routed to them: Zipf demand over
several models on workers that each hold fewer, the same arrivals under each policy in
one run (a design study for models kept loaded by demand; nothing here runs in a worker).

    .venv/bin/python -m bench.residency [--models 6] [--workers 2] [--slots 2]
        [--zipf 1.1] [--hours 4] [--load 0.4] [--seeds 3] [--routing warm|hold]
        [--hold 20] [--json FILE]

A discrete-event simulation. The model a worker unloads is chosen by `lru` (what
workers/models.py does) or by `demand` (`choose_victim`: the lowest expected demand x
reload seconds, demand being the jobs that arrived in the last DEMAND_WINDOW seconds plus
those queued now, a model loaded under MIN_RESIDENT seconds ago valued as if a job came
every MIN_RESIDENT seconds). Routing `warm` is app/jobs/fairness.py's rule reduced to one
queue: a free worker takes the oldest job of a model it holds, unless the oldest job of
all has been passed over DIFFQ_WARM_MAX_SKIPS times (4), then that one, loading its
model. Routing `hold` adds: a free worker with no warm job leaves a cold job whose model
another worker holds for up to --hold seconds (it is not starved: past that it loads).
Jobs arrive as a Poisson process (the rate set by --load: the fraction of the workers'
time the jobs alone would fill), each of a model
drawn from Zipf(--zipf) over --models models, each running an exponential time (mean 3
s); each model's reload takes its own seconds (6 to 15, as SD 1.5 to SDXL loads and
warm-ups do on a GPU).

Reported per policy, each seed and their mean: loads per 100 jobs, p50 and p99 wait (from
arrival to the first step: queue plus any load), and the rarest model's longest wait; and
demand's ratio to LRU on each. The goals set for residency by demand: loads at most
0.5x LRU's, the rarest model's longest wait within 2x of LRU's (docs/performance.md has
the runs).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

SERVICE_MEAN = 3.0
# The recent window demand is counted over (arrivals), and queued jobs are spread over.
DEMAND_WINDOW = 300.0
MAX_SKIPS = 4
MIN_RESIDENT = 60.0
RELOAD_SECONDS = (8.0, 10.0, 12.0, 6.0, 9.0, 15.0, 7.0, 11.0)


@dataclass(frozen=True)
class Held:
    """A loaded model as the choice sees it; `Sequence[Held]` comes least recent first."""

    name: str
    loaded_at: float  # monotonic seconds
    reload_seconds: float


@dataclass(frozen=True)
class Demand:
    """A model's demand: jobs that arrived per second over the recent window, and jobs
    queued now."""

    arrivals_per_second: float = 0.0
    queued: int = 0


def keep_value(held: Held, demand: Mapping[str, Demand], window: float) -> float:
    """Expected reload seconds its unloading costs: (arrival rate + queued / window) x
    reload seconds."""
    wanted = demand.get(held.name)
    if wanted is None:
        return 0.0
    rate = wanted.arrivals_per_second + wanted.queued / max(window, 1e-9)
    return rate * max(held.reload_seconds, 1e-3)


def choose_victim(
    held: Sequence[Held],
    demand: Mapping[str, Demand],
    *,
    now: float,
    min_resident: float,
    window: float,
    policy: str = "demand",
) -> str:
    """The loaded model to unload (`held` least recent first, never empty): the lowest
    keep value; a model loaded less than `min_resident` seconds ago is valued as if a job
    came for it every `min_resident` seconds at least (its reload is not thrown away at
    once, yet it never keeps out a model in demand)."""
    if policy == "lru":
        return held[0].name

    def value(h: Held) -> float:
        kept = keep_value(h, demand, window)
        if min_resident > 0 and now - h.loaded_at < min_resident:
            kept = max(kept, h.reload_seconds / min_resident)
        return kept

    # min() keeps the first of equals: the least recently used among them.
    return min(held, key=value).name


@dataclass
class Job:
    id: int
    model: int
    arrived: float
    service: float
    skips: int = 0


@dataclass
class Worker:
    loaded: dict[int, float] = field(default_factory=dict)  # model -> loaded_at
    used: dict[int, float] = field(default_factory=dict)  # model -> last used
    busy: bool = False


def simulate(policy: str, args, seed: int) -> dict:
    rng = random.Random(seed)
    weights = [1 / (k + 1) ** args.zipf for k in range(args.models)]
    rate = args.load * args.workers / SERVICE_MEAN
    horizon = args.hours * 3600
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t > horizon:
            break
        model = rng.choices(range(args.models), weights)[0]
        arrivals.append(Job(len(arrivals), model, t, rng.expovariate(1 / SERVICE_MEAN)))
    workers = [Worker() for _ in range(args.workers)]
    queue: list[Job] = []
    recent: deque[tuple[float, int]] = deque()  # (arrived, model) within the window
    events: list[tuple[float, int, str, int]] = []  # (time, order, kind, index)
    for job in arrivals:
        heapq.heappush(events, (job.arrived, job.id, "arrive", job.id))
    order = len(arrivals)
    nonlocal_order = [10**12]  # wake-ups' tie-break order, apart from the others
    loads, waits, by_model = 0, [], {m: [] for m in range(args.models)}

    def demand(now: float) -> dict[str, Demand]:
        while recent and recent[0][0] < now - DEMAND_WINDOW:
            recent.popleft()
        counts: dict[int, int] = {}
        for _, m in recent:
            counts[m] = counts.get(m, 0) + 1
        queued: dict[int, int] = {}
        for job in queue:
            queued[job.model] = queued.get(job.model, 0) + 1
        names = set(counts) | set(queued)
        return {str(m): Demand(counts.get(m, 0) / DEMAND_WINDOW, queued.get(m, 0)) for m in names}

    def pick(worker: Worker, now: float) -> Job | None:
        if not queue:
            return None
        oldest = queue[0]
        if oldest.model in worker.loaded or oldest.skips >= MAX_SKIPS:
            return queue.pop(0)
        warm = next((j for j in queue if j.model in worker.loaded), None)
        if warm is None and args.routing == "hold":
            # A cold job waits a while for a worker that holds its model, if one does.
            others = [w for w in workers if w is not worker]
            for job in queue:
                elsewhere = any(job.model in w.loaded for w in others)
                if not elsewhere or now - job.arrived >= args.hold - 1e-9:
                    queue.remove(job)
                    return job
            return None
        if warm is None:
            return queue.pop(0)
        for job in queue:  # every job older than the warm one is passed over once
            if job is warm:
                break
            job.skips += 1
        queue.remove(warm)
        return warm

    def start(index: int, now: float) -> None:
        nonlocal loads, order
        worker = workers[index]
        job = pick(worker, now)
        if job is None:
            worker.busy = False
            if queue and args.routing == "hold":  # look again when the oldest's hold ends
                nonlocal_order[0] += 1
                due = max(now, queue[0].arrived + args.hold)
                heapq.heappush(events, (due, nonlocal_order[0], "wake", index))
            return
        worker.busy = True
        ready = now
        if job.model not in worker.loaded:
            if len(worker.loaded) >= args.slots:
                held = [
                    Held(str(m), worker.loaded[m], RELOAD_SECONDS[m])
                    for m in sorted(worker.loaded, key=lambda m: worker.used[m])
                ]
                victim = choose_victim(
                    held,
                    demand(now) if policy == "demand" else {},
                    now=now,
                    min_resident=MIN_RESIDENT,
                    window=DEMAND_WINDOW,
                    policy=policy,
                )
                del worker.loaded[int(victim)], worker.used[int(victim)]
            ready += RELOAD_SECONDS[job.model]
            worker.loaded[job.model] = ready
            loads += 1
        worker.used[job.model] = ready
        waits.append(ready - job.arrived)
        by_model[job.model].append(ready - job.arrived)
        order += 1
        heapq.heappush(events, (ready + job.service, order, "free", index))

    while events:
        now, _, kind, index = heapq.heappop(events)
        if kind == "arrive":
            job = arrivals[index]
            queue.append(job)
            recent.append((now, job.model))
            for i, worker in enumerate(workers):
                if not worker.busy:
                    start(i, now)
                    break
        elif kind == "wake":
            if not workers[index].busy:
                start(index, now)
        else:
            start(index, now)
    waits.sort()
    rarest = max(m for m in by_model if by_model[m])
    return {
        "jobs": len(waits),
        "loads_per_100": 100 * loads / len(waits),
        "p50_wait": waits[len(waits) // 2],
        "p99_wait": waits[int(len(waits) * 0.99)],
        "rarest_max_wait": max(by_model[rarest]),
        "rarest_jobs": len(by_model[rarest]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--hours", type=float, default=4.0)
    parser.add_argument("--load", type=float, default=0.4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--routing", choices=("warm", "hold"), default="warm")
    parser.add_argument("--hold", type=float, default=20.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.models > len(RELOAD_SECONDS):
        parser.error(f"--models: at most {len(RELOAD_SECONDS)}")
    rows = []
    for seed in range(args.seeds):
        for policy in ("lru", "demand"):
            rows.append({"seed": seed, "policy": policy, **simulate(policy, args, seed)})
    keys = ("loads_per_100", "p50_wait", "p99_wait", "rarest_max_wait")
    mean = {
        policy: {k: sum(r[k] for r in rows if r["policy"] == policy) / args.seeds for k in keys}
        for policy in ("lru", "demand")
    }
    print(
        f"{args.models} models (Zipf {args.zipf}), {args.workers} workers x {args.slots} "
        f"loaded, load {args.load}, {args.hours} h simulated per seed; reload "
        f"{list(RELOAD_SECONDS[: args.models])} s, jobs {SERVICE_MEAN} s on average"
    )
    print(f"{'seed':>4} {'policy':>7} {'jobs':>6} {'loads/100':>10} {'p50 s':>7} "
          f"{'p99 s':>7} {'rarest max s':>13} {'rarest jobs':>12}")  # fmt: skip
    for r in rows:
        print(f"{r['seed']:>4} {r['policy']:>7} {r['jobs']:>6} {r['loads_per_100']:>10.2f} "
              f"{r['p50_wait']:>7.1f} {r['p99_wait']:>7.1f} {r['rarest_max_wait']:>13.1f} "
              f"{r['rarest_jobs']:>12}")  # fmt: skip
    print(f"{'mean':>4} {'':>7} {'':>6} " + " ".join(f"{k:>10}" for k in keys))
    for policy in ("lru", "demand"):
        print(f"{'':>4} {policy:>7} {'':>6} " + " ".join(f"{mean[policy][k]:>10.2f}" for k in keys))
    ratios = {k: mean["demand"][k] / mean["lru"][k] for k in keys}
    print(f"{'':>4} {'ratio':>7} {'':>6} " + " ".join(f"{ratios[k]:>9.2f}x" for k in keys))
    print(
        f"goals: loads {ratios['loads_per_100']:.2f}x LRU (at most 0.5x), rarest model's "
        f"longest wait {ratios['rarest_max_wait']:.2f}x LRU (at most 2x)"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rows": rows, "mean": mean, "ratios": ratios}, out, indent=2)


if __name__ == "__main__":
    main()
