"""Which loaded model a worker unloads to make room: a second copy first (another live
worker holds it too), then the model whose unloading costs the fleet least by demand,
expected jobs x reload seconds (issue 42's residency by demand; docs/performance.md has
the simulation that chose it, bench/residency.py, which runs this very function).

Demand is what the database says of each model (app/jobs/residency.py `demand`): the jobs
that finished or run within the last DEMAND_WINDOW seconds, as a rate, plus those queued
now spread over the window. A model loaded less than MIN_RESIDENT seconds ago is valued as
if a job came for it every MIN_RESIDENT seconds at least: its load is not thrown away at
once, and it never keeps out a model in demand. Among equals the least recently used goes,
so with no demand known (a database outage) the choice is least recently used.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

# The recent window demand is counted over, and queued jobs are spread over.
DEMAND_WINDOW = 300.0
# Seconds a loaded model is kept as if in demand (its own load seconds' worth).
MIN_RESIDENT = 60.0


@dataclass(frozen=True)
class Held:
    """A loaded model as the choice sees it; `Sequence[Held]` comes least recent first."""

    name: str
    loaded_at: float  # monotonic seconds
    reload_seconds: float


@dataclass(frozen=True)
class Demand:
    """A model's demand: jobs per second over the recent window, and jobs queued now."""

    per_second: float = 0.0
    queued: int = 0


def keep_value(held: Held, demand: Mapping[str, Demand], window: float = DEMAND_WINDOW) -> float:
    """Expected reload seconds per second its unloading costs: (rate + queued / window) x
    reload seconds."""
    wanted = demand.get(held.name)
    if wanted is None:
        return 0.0
    rate = wanted.per_second + wanted.queued / max(window, 1e-9)
    return rate * max(held.reload_seconds, 1e-3)


def choose_victim(
    held: Sequence[Held],
    demand: Mapping[str, Demand],
    *,
    now: float,
    copies: Collection[str] = (),
    policy: str = "demand",
    min_resident: float = MIN_RESIDENT,
    window: float = DEMAND_WINDOW,
) -> str:
    """The loaded model to unload (`held` least recent first, never empty). `copies`:
    those another live worker holds too, unloaded first. `policy` "lru" takes the least
    recently used (of the copies, if any) and nothing else."""
    spare = [h for h in held if h.name in copies] or list(held)
    if policy == "lru":
        return spare[0].name

    def value(h: Held) -> float:
        kept = keep_value(h, demand, window)
        if min_resident > 0 and now - h.loaded_at < min_resident:
            kept = max(kept, h.reload_seconds / min_resident)
        return kept

    # min() keeps the first of equals: the least recently used among them.
    return min(spare, key=value).name
