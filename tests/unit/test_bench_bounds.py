"""bench/hold.py's reference rows: the loads a cache of given slots makes on the bench's
arrivals, by LRU and by the fewest possible (Belady's), checked on sequences whose
answer is known by hand."""

from __future__ import annotations

from bench.hold import loads_fewest, loads_lru


def test_lru_thrashes_a_cycle_one_longer_than_its_slots_and_the_fewest_does_not():
    cycle = [0, 1, 2] * 4
    assert loads_lru(cycle, 2) == 12  # every access a miss
    # Belady keeps the model needed soonest: 0,1 load; 2 replaces 1 (needed last); …
    assert loads_fewest(cycle, 2) == 7
    assert loads_lru(cycle, 3) == loads_fewest(cycle, 3) == 3


def test_a_hot_model_stays_under_lru_between_two_cold_ones():
    assert loads_lru([0, 1, 0, 2, 0, 1], 2) == 4  # 0, 1, 2 (out: 1), 1 (out: 2)
    assert loads_fewest([0, 1, 0, 2, 0, 1], 2) == 4
