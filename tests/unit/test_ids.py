"""Job ids are UUIDv7 that sort in the order one process made them."""

from __future__ import annotations

import itertools
import uuid

from app.ids import uuid7


def test_ids_made_in_one_millisecond_sort_in_the_order_they_were_made():
    ids = [uuid7() for _ in range(5000)]  # many share a millisecond
    same_ms = sum(1 for a, b in itertools.pairwise(ids) if a.int >> 80 == b.int >> 80)
    print(f"\n{same_ms} of {len(ids) - 1} consecutive ids shared a millisecond")
    assert same_ms > 0
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert {i.version for i in ids} == {7}
    assert {i.variant for i in ids} == {uuid.RFC_4122}


def test_an_explicit_time_is_kept():
    made = uuid7(now_ms=1_700_000_000_000)
    assert made.int >> 80 == 1_700_000_000_000
    assert made.version == 7
