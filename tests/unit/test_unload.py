"""Which loaded model a worker unloads (workers/unload.py): a second copy first, then the
lowest expected demand x reload seconds, a model loaded under MIN_RESIDENT seconds ago
kept as if in demand, the least recent among equals; `lru` takes the least recent."""

from __future__ import annotations

from workers.unload import MIN_RESIDENT, Demand, Held, choose_victim, keep_value

LONG_AGO = -10_000.0


def _held(*specs: tuple[str, float]) -> list[Held]:
    """(name, reload seconds), least recent first, all loaded long ago."""
    return [Held(name, LONG_AGO, reload) for name, reload in specs]


def test_the_model_least_wanted_times_its_reload_goes_not_the_least_recent():
    held = _held(("popular", 10.0), ("rare", 10.0))
    wanted = {"popular": Demand(per_second=0.5), "rare": Demand(per_second=0.01)}
    assert choose_victim(held, wanted, now=0.0) == "rare"
    assert choose_victim(held, wanted, now=0.0, policy="lru") == "popular"


def test_a_slow_reload_outweighs_a_little_more_demand():
    """Unloading a model costs its reloads: 0.1 jobs/s x 30 s beats 0.2 jobs/s x 5 s."""
    held = _held(("quick", 5.0), ("slow", 30.0))
    wanted = {"quick": Demand(per_second=0.2), "slow": Demand(per_second=0.1)}
    assert choose_victim(held, wanted, now=0.0) == "quick"
    assert keep_value(held[1], wanted) > keep_value(held[0], wanted)


def test_queued_jobs_count_as_demand_spread_over_the_window():
    held = _held(("a", 10.0), ("b", 10.0))
    assert choose_victim(held, {"a": Demand(queued=3)}, now=0.0) == "b"
    assert choose_victim(held, {"b": Demand(queued=3)}, now=0.0) == "a"


def test_a_second_copy_goes_first_whatever_its_demand():
    held = _held(("copied", 10.0), ("only", 10.0), ("idle", 10.0))
    wanted = {"copied": Demand(per_second=1.0), "only": Demand(per_second=0.5)}
    assert choose_victim(held, wanted, now=0.0) == "idle"
    assert choose_victim(held, wanted, now=0.0, copies={"copied"}) == "copied"
    assert choose_victim(held, {}, now=0.0, copies={"only", "idle"}, policy="lru") == "only"


def test_a_model_just_loaded_is_kept_as_if_in_demand_until_min_resident():
    """A model loaded a moment ago, nobody asking for it yet, is not thrown out for one
    with a little demand; past MIN_RESIDENT it is."""
    fresh = Held("fresh", 0.0, 12.0)
    older = Held("older", LONG_AGO, 12.0)
    wanted = {"older": Demand(per_second=0.05)}  # 0.6 s/s, over the fresh one's 12 / 60
    assert keep_value(older, wanted) > 12.0 / MIN_RESIDENT
    assert choose_victim([older, fresh], wanted, now=1.0) == "fresh"
    little = {"older": Demand(per_second=0.01)}  # 0.12 s/s, under the fresh one's 0.2
    assert choose_victim([older, fresh], little, now=1.0) == "older"
    assert choose_victim([older, fresh], little, now=MIN_RESIDENT + 1.0) == "fresh"


def test_with_no_demand_known_the_least_recent_goes():
    held = _held(("a", 10.0), ("b", 30.0), ("c", 5.0))
    assert choose_victim(held, {}, now=0.0) == "a"
