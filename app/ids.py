"""Time-ordered UUIDs (version 7), so that ids sort newest-last and page cheaply."""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last = (0, 0)  # (milliseconds, rand_a) of this process's latest id


def uuid7(now_ms: int | None = None) -> uuid.UUID:
    """RFC 9562 UUIDv7: 48-bit Unix milliseconds, 12 bits that order ids made in the same
    millisecond by this process (RFC 9562's method 3: a counter seeded at random), then 62
    random bits. Ids of one process sort in the order they were made, so "the oldest job"
    is well defined even for jobs created in one millisecond."""
    global _last
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    rand = int.from_bytes(os.urandom(10), "big")
    with _lock:
        last_ms, last_seq = _last
        if ms <= last_ms and now_ms is None and last_seq < 0xFFF:
            ms, seq = last_ms, last_seq + 1  # same millisecond (or the clock stepped back)
        else:
            if ms <= last_ms and now_ms is None:
                ms = last_ms + 1  # the counter ran out: borrow the next millisecond
            seq = (rand >> 64) & 0x7FF  # random start, leaving room to count up
        if now_ms is None:
            _last = (ms, seq)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= seq << 64  # rand_a: the counter
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    return uuid.UUID(int=value)
