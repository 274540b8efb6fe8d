"""testbed/rabbit_boot.py `BootWatch.wait_serving` (each quorum node's, and the fault
scenarios' private node's): a node's boot fails when it stops moving, not when it is
slow. Run 51 restarted a quorum node on a machine so loaded (four test processes on two
cores) that its boot outlasted a fixed 90 s while its log still grew; here the same
boot, stretched further, is waited for, and a boot that stalls or dies still fails. A
fake clock: no RabbitMQ, no waiting."""

from __future__ import annotations

import pytest

from testbed import rabbit_boot
from testbed.fake_clock import FakeClock
from testbed.rabbit_boot import STALL_FACTOR
from testbed.rabbit_cluster import Node


class FakeNode(Node):
    """A boot whose log grows by a line every `every` seconds until `serves_at`;
    `dies_at`: its VM exits then."""

    def __init__(self, clock: FakeClock, *, every: float, serves_at: float, dies_at=None) -> None:
        self.clock, self.every, self.serves_at, self.dies_at = clock, every, serves_at, dies_at
        self.name = "rabbit@10.0.0.1"
        self.ports = (("10.0.0.1", 5672),)

    def pid(self) -> int | None:
        return 4242

    def booting(self) -> tuple[bool, int]:
        alive = self.dies_at is None or self.clock.now < self.dies_at
        grown = min(self.clock.now, self.serves_at, self.dies_at or float("inf"))
        return alive, int(grown // self.every)

    def serving(self) -> bool:
        return self.clock.now >= self.serves_at

    def log(self) -> str:
        return "starting rabbit\n"


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(rabbit_boot, "time", fake)
    monkeypatch.setattr(rabbit_boot, "port_open", lambda host, port: True)
    return fake


def test_a_slow_boot_that_keeps_moving_is_waited_for_past_its_timeout(clock):
    node = FakeNode(clock, every=20.0, serves_at=250.0)  # 90 s would have failed it
    node.wait_serving(90)
    assert clock.now >= 250.0


def test_a_boot_whose_log_stops_fails_after_its_timeout(clock):
    node = FakeNode(clock, every=20.0, serves_at=10_000.0)
    node.every = float("inf")  # never a line
    with pytest.raises(TimeoutError, match="stalled"):
        node.wait_serving(90)
    assert 90 < clock.now < 92


def test_a_boot_that_never_ends_fails_at_its_cap(clock):
    node = FakeNode(clock, every=20.0, serves_at=10_000.0)
    with pytest.raises(TimeoutError, match="did not start"):
        node.wait_serving(90)
    assert STALL_FACTOR * 90 < clock.now < STALL_FACTOR * 90 + 2


def test_a_vm_that_dies_booting_fails_at_once(clock):
    node = FakeNode(clock, every=20.0, serves_at=300.0, dies_at=30.0)
    with pytest.raises(RuntimeError, match="died booting"):
        node.wait_serving(90)
    assert clock.now < 31
