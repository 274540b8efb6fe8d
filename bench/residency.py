"""Which models a worker keeps loaded, and how jobs are routed to them: Zipf demand over
several models on workers that each hold fewer, the same arrivals under each variant in
one run, each against today's old rule (warm routing, LRU unloading) as the baseline.

    .venv/bin/python -m bench.residency [--models 6] [--workers 2] [--slots 2]
        [--zipf 1.1] [--hours 4] [--load 0.4] [--seeds 3] [--hold 20] [--json FILE]

A discrete-event simulation; the unloading choice is the workers' own function
(workers/unload.py `choose_victim`). Variants:
- `warm, lru` (the baseline): app/jobs/fairness.py's rule reduced to one queue: a free
  worker takes the oldest job of a model it holds, unless the oldest job of all has been
  passed over DIFFQ_WARM_MAX_SKIPS times (4), then that one, loading its model; it unloads
  its least recently used model.
- `hold, ...`: a free worker with no warm job leaves a cold job whose model another worker
  holds for up to --hold seconds (never starved: past that it loads); it unloads `lru`
  (its least recently used), `copies` (a second copy first, then LRU) or `demand` (a
  second copy first, then the lowest expected demand x reload seconds: the workers' rule).
- `... + place`: a model held nowhere is loaded by the worker whose unloading costs the
  fleet least (a cold job waits for it, up to --hold); not built in the workers.
Jobs arrive as a Poisson process (the rate set by --load: the fraction of the workers'
time the jobs alone would fill), each of a model drawn from Zipf(--zipf) over --models
models, each running an exponential time (mean 3 s); each model's reload takes its own
seconds (6 to 15, as SD 1.5 to SDXL loads and warm-ups do on a GPU). Demand, as in the
workers: jobs seen in the last DEMAND_WINDOW seconds plus those queued now.

Reported per variant, each seed and their mean: loads per 100 jobs, p50 and p99 wait (from
arrival to the first step: queue plus any load), and the rarest model's longest wait; and
each mean's ratio to the baseline's. The goals set for residency by demand: loads at most
0.5x the baseline's, the rarest model's longest wait within 2x (docs/performance.md has
the runs).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
from collections import deque
from dataclasses import dataclass, field

from workers.unload import DEMAND_WINDOW, MIN_RESIDENT, Demand, Held, choose_victim, keep_value

SERVICE_MEAN = 3.0
MAX_SKIPS = 4
RELOAD_SECONDS = (8.0, 10.0, 12.0, 6.0, 9.0, 15.0, 7.0, 11.0)
# (routing, unloading, placement); the first is the baseline.
VARIANTS = (
    ("warm", "lru", False),
    ("hold", "lru", False),
    ("hold", "copies", False),
    ("hold", "demand", False),
    ("hold", "demand", True),
)


def label(variant: tuple[str, str, bool]) -> str:
    routing, unloading, place = variant
    return f"{routing}, {unloading}" + (" + place" if place else "")


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


def simulate(variant: tuple[str, str, bool], args, seed: int) -> dict:
    routing, policy, place = variant
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

    def copies_of(w: Worker) -> frozenset[str]:
        if policy == "lru":
            return frozenset()
        others = [o for o in workers if o is not w]
        return frozenset(str(m) for m in w.loaded if any(m in o.loaded for o in others))

    def victim(w: Worker, now: float) -> tuple[str, float]:
        """The model `w` would unload, and what keeping it is worth (-2: a free slot, -1:
        a second copy; else its last use under LRU, its keep value by demand)."""
        if len(w.loaded) < args.slots:
            return "", -2.0
        held = [
            Held(str(m), w.loaded[m], RELOAD_SECONDS[m])
            for m in sorted(w.loaded, key=lambda m: w.used[m])
        ]
        copies = copies_of(w)
        wanted = demand(now) if policy == "demand" else {}
        name = choose_victim(
            held, wanted, now=now, copies=copies, policy="demand" if policy == "demand" else "lru"
        )
        if name in copies:
            return name, -1.0
        if policy != "demand":
            return name, w.used[int(name)]
        chosen = next(h for h in held if h.name == name)
        return name, max(keep_value(chosen, wanted), chosen.reload_seconds / MIN_RESIDENT)

    def placed_here(worker: Worker, now: float) -> bool:
        """Whether a model held nowhere is best loaded here: this worker's unload costs
        the fleet least (the fleet's least recently used copy)."""
        mine = victim(worker, now)[1]
        return all(mine <= victim(w, now)[1] for w in workers if w is not worker)

    def pick(worker: Worker, now: float) -> Job | None:
        if not queue:
            return None
        oldest = queue[0]
        if oldest.model in worker.loaded or oldest.skips >= MAX_SKIPS:
            return queue.pop(0)
        warm = next((j for j in queue if j.model in worker.loaded), None)
        if warm is None and routing == "hold":
            # A cold job waits a while for a worker that holds its model, if one does.
            others = [w for w in workers if w is not worker]
            for job in queue:
                elsewhere = any(job.model in w.loaded for w in others)
                due = now - job.arrived >= args.hold - 1e-9
                if place and not elsewhere and not due and not placed_here(worker, now):
                    continue
                if not elsewhere or due:
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
            if queue and routing == "hold":  # look again when the oldest's hold ends
                nonlocal_order[0] += 1
                due = max(now, queue[0].arrived + args.hold)
                heapq.heappush(events, (due, nonlocal_order[0], "wake", index))
            return
        worker.busy = True
        ready = now
        if job.model not in worker.loaded:
            if len(worker.loaded) >= args.slots:
                del worker.loaded[int(victim(worker, now)[0])]
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
                    if worker.busy:
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
    parser.add_argument("--hold", type=float, default=20.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.models > len(RELOAD_SECONDS):
        parser.error(f"--models: at most {len(RELOAD_SECONDS)}")
    rows = [
        {"seed": seed, "variant": label(variant), **simulate(variant, args, seed)}
        for seed in range(args.seeds)
        for variant in VARIANTS
    ]
    keys = ("loads_per_100", "p50_wait", "p99_wait", "rarest_max_wait")
    names = [label(v) for v in VARIANTS]
    mean = {
        name: {k: sum(r[k] for r in rows if r["variant"] == name) / args.seeds for k in keys}
        for name in names
    }
    ratios = {name: {k: mean[name][k] / mean[names[0]][k] for k in keys} for name in names}
    print(
        f"{args.models} models (Zipf {args.zipf}), {args.workers} workers x {args.slots} "
        f"loaded, load {args.load}, {args.hours} h simulated per seed, hold {args.hold} s; "
        f"reload {list(RELOAD_SECONDS[: args.models])} s, jobs {SERVICE_MEAN} s on average"
    )
    print(f"{'seed':>4} {'variant':>20} {'jobs':>6} {'loads/100':>10} {'p50 s':>7} "
          f"{'p99 s':>7} {'rarest max s':>13} {'rarest jobs':>12}")  # fmt: skip
    for r in rows:
        print(f"{r['seed']:>4} {r['variant']:>20} {r['jobs']:>6} {r['loads_per_100']:>10.2f} "
              f"{r['p50_wait']:>7.1f} {r['p99_wait']:>7.1f} {r['rarest_max_wait']:>13.1f} "
              f"{r['rarest_jobs']:>12}")  # fmt: skip
    print(f"\nmeans of {args.seeds} seeds, and each ratio to the baseline ({names[0]})")
    print(f"{'variant':>20} " + " ".join(f"{k:>22}" for k in keys))
    for name in names:
        cells = (f"{mean[name][k]:>14.2f} ({ratios[name][k]:.2f}x)" for k in keys)
        print(f"{name:>20} " + " ".join(cells))
    built = label(("hold", "demand", False))
    print(
        f"goals ({built}, the workers' rule): loads {ratios[built]['loads_per_100']:.2f}x "
        f"the baseline's (at most 0.5x), the rarest model's longest wait "
        f"{ratios[built]['rarest_max_wait']:.2f}x (at most 2x)"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rows": rows, "mean": mean, "ratios": ratios}, out, indent=2)


if __name__ == "__main__":
    main()
