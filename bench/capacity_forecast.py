"""Capacity before the burst: GPU workers scaled on the backlog alone (reactive), against
scaled on the larger of the backlog and the demand forecast (predictive), in a simulation
of a week of history and then a weekday with a morning burst.

    .venv/bin/python -m bench.capacity_forecast [--seed 7] [--arrive-minutes 3]
        [--job-seconds 30] [--lookahead-minutes 10]

- **Arrivals**: Poisson, at a rate that follows the time of day (1 job a minute at
  night, 6 in the working day, 3 in the evening) with a morning burst (24 a minute,
  09:00-10:00) on weekdays; weekends at half the rate and no burst. Seven days of
  history, then a Monday; both policies see the same arrivals.
- **Jobs** take `job-seconds` on one GPU; FIFO.
- **Scaling**, as deploy/k8s/base/keda.yaml: every 15 s, reactive desire = busy workers +
  ceil(backlog GPU-seconds / 600); predictive desire = the larger of that and
  ceil(forecast GPUs), the forecast being app/jobs/forecast.py's `forecast_rate` over
  the arrivals so far x job seconds / 60. A worker asked for arrives `arrive-minutes`
  later and is billed from the ask. Scale-down as the HPA behaviour there: the highest
  desire of the last 10 minutes, at most one idle worker removed per 5 minutes. 1 to 64.

Figures are the Monday's: jobs, wait p50/p95/p99, GPU-hours, and predictive / reactive.
"""

from __future__ import annotations

import argparse
import math
import random
from collections import deque

from app.jobs.forecast import DAY, Horizon, forecast_rate, lags
from bench.report import percentile, print_table

POLL = 15  # seconds, KEDA's pollingInterval
PER_WORKER = 600  # GPU-seconds of backlog a worker is asked for (the trigger's threshold)
STABILIZE = 600  # seconds of scale-down stabilization
SCALE_DOWN_EVERY = 300  # one worker removed per this many seconds at most
MIN_WORKERS, MAX_WORKERS = 1, 64


def rate(minute: int) -> float:
    """Jobs a minute at an absolute minute (day 0 is a Monday)."""
    day, hour = divmod(minute, DAY)[0] % 7, (minute % DAY) / 60
    weekend = day >= 5
    if 9 <= hour < 10 and not weekend:
        return 24.0
    base = 1.0 if hour < 7 else 6.0 if hour < 19 else 3.0
    return base / 2 if weekend else base


def arrivals(days: int, seed: int) -> list[float]:
    """Arrival times, in seconds from the start of day 0."""
    rng = random.Random(seed)
    times = []
    for minute in range(days * DAY):
        lam = rate(minute)
        t = 0.0
        while True:
            t += rng.expovariate(lam / 60.0)
            if t >= 60:
                break
            times.append(minute * 60 + t)
    return times


def simulate(
    times: list[float], start: int, job_seconds: float, arrive: int, predictive: bool, horizon
) -> dict:
    """Run the day from `start` (seconds) with the arrivals in `times` (all of them form
    the forecast's history; only the day's are served and counted)."""
    counts: dict[int, float] = {}
    history = deque(t for t in times if t < start)
    for t in history:
        counts[int(t // 60)] = counts.get(int(t // 60), 0) + 1
    todays = deque(t for t in times if start <= t < start + DAY * 60)
    lag_list = lags(start // 60)
    queue: deque[float] = deque()
    busy: list[float] = []  # each busy worker's finishing time
    idle = MIN_WORKERS
    coming: deque[int] = deque()  # arrival times of workers asked for
    desires: deque[tuple[int, int]] = deque()
    last_down = -SCALE_DOWN_EVERY
    waits, worker_seconds = [], 0.0
    for now in range(start, start + DAY * 60):
        while todays and todays[0] <= now:
            t = todays.popleft()
            counts[int(t // 60)] = counts.get(int(t // 60), 0) + 1
            queue.append(t)
        while coming and coming[0] <= now:
            coming.popleft()
            idle += 1
        done = [f for f in busy if f <= now]
        if done:
            busy = [f for f in busy if f > now]
            idle += len(done)
        while queue and idle:
            waits.append(now - queue.popleft())
            busy.append(now + job_seconds)
            idle -= 1
        if (now - start) % POLL == 0:
            desire = len(busy) + math.ceil(len(queue) * job_seconds / PER_WORKER)
            if predictive:
                jobs_a_minute = forecast_rate(counts, now // 60, lag_list, horizon)
                desire = max(desire, math.ceil(jobs_a_minute * job_seconds / 60 - 1e-9))
            desire = min(MAX_WORKERS, max(MIN_WORKERS, desire))
            desires.append((now, desire))
            while desires[0][0] < now - STABILIZE:
                desires.popleft()
            held = len(busy) + idle + len(coming)
            if desire > held:
                coming.extend([now + arrive] * (desire - held))
            elif max(d for _, d in desires) < held and idle and now - last_down >= SCALE_DOWN_EVERY:
                idle -= 1
                last_down = now
        worker_seconds += len(busy) + idle + len(coming)
    return {
        "jobs": len(waits),
        "wait p50 s": percentile(waits, 50),
        "wait p95 s": percentile(waits, 95),
        "wait p99 s": percentile(waits, 99),
        "GPU-hours": worker_seconds / 3600,
        "busy GPU-hours": len(waits) * job_seconds / 3600,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--arrive-minutes", type=float, default=3.0)
    parser.add_argument("--job-seconds", type=float, default=30.0)
    parser.add_argument("--lookahead-minutes", type=int, default=10)
    args = parser.parse_args()
    times = arrivals(8, args.seed)
    start = 7 * DAY * 60  # the Monday after the week of history
    horizon = Horizon(lookahead=args.lookahead_minutes)
    arrive = round(args.arrive_minutes * 60)
    rows = []
    for name, predictive in (("reactive (backlog)", False), ("predictive (max)", True)):
        row = simulate(times, start, args.job_seconds, arrive, predictive, horizon)
        rows.append({"policy": name, **row})
    base, pred = rows
    rows.append(
        {
            "policy": "predictive / reactive",
            "jobs": "",
            **{
                k: f"{pred[k] / base[k]:.2f}x" if base[k] else "-"
                for k in ("wait p50 s", "wait p95 s", "wait p99 s", "GPU-hours")
            },
            "busy GPU-hours": "",
        }
    )
    for row in rows[:2]:
        for k in ("wait p50 s", "wait p95 s", "wait p99 s", "GPU-hours", "busy GPU-hours"):
            row[k] = f"{row[k]:.1f}"
    print_table(
        f"A Monday after a week of history: morning burst 09:00-10:00 (4x), jobs of "
        f"{args.job_seconds:g} GPU-seconds, workers arriving {args.arrive_minutes:g} min "
        f"after the ask, forecast lookahead {args.lookahead_minutes} min (seed {args.seed})",
        rows,
        list(rows[0]),
    )


if __name__ == "__main__":
    main()
