"""A clock for tests of waits: `monotonic` reads it, `sleep` moves it on at once. Patched
in for a module's `time`, it widens a wait's window without waiting."""

from __future__ import annotations


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
