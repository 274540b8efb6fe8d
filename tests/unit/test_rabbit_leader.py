"""testbed/rabbit_cluster.py `RabbitCluster.leader`: which node leads a quorum queue,
failing when the answers name no leader, not when rabbitmqctl is slow to answer. CI once
failed Q1 twice at its first question, before any fault: each call had a 15 s bound, the
machine was loaded, and three unanswered calls read as "no node leads gpu.tiny". A fake
clock and fake rabbitmqctl answers: no RabbitMQ, no waiting."""

from __future__ import annotations

import subprocess

import pytest

from testbed import rabbit_cluster
from testbed.fake_clock import FakeClock
from testbed.rabbit_cluster import STALL_FACTOR, RabbitCluster


class FakeNode:
    """A node whose rabbitmqctl takes `cost` seconds to answer; `answer(now)` is its
    listing then, or None when the node is down (a quick refusal)."""

    def __init__(self, clock: FakeClock, name: str, answer, cost: float = 1.0) -> None:
        self.clock, self.name, self.answer, self.cost = clock, name, answer, cost
        self.asked = 0

    def ctl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        self.asked += 1
        listing = self.answer(self.clock.now)
        if listing is None:
            self.clock.now += 0.5
            return subprocess.CompletedProcess(args, 69, "", "unable to connect")
        if self.cost > timeout:
            self.clock.now += timeout
            return subprocess.CompletedProcess(args, 124, "", "timed out")
        self.clock.now += self.cost
        return subprocess.CompletedProcess(args, 0, listing, "")


def listing(leader: str | None) -> str:
    gpu = f"gpu.tiny\t{leader}" if leader else "gpu.tiny\t"
    return f"webhooks\trabbit@10.0.0.2\n{gpu}\ngpu.tiny-batch\trabbit@10.0.0.3\n"


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(rabbit_cluster, "time", fake)
    return fake


def cluster_of(*nodes: FakeNode) -> RabbitCluster:
    cluster = RabbitCluster.__new__(RabbitCluster)  # no LAN: nothing here starts
    cluster.nodes = list(nodes)
    return cluster


def test_a_slow_cli_is_waited_for_and_one_answer_is_enough(clock):
    # 20 s an answer: past the old 15 s bound, which failed CI's Q1 twice.
    nodes = [FakeNode(clock, f"rabbit@10.0.0.{i}", lambda now: listing("rabbit@10.0.0.2"), 20)
             for i in (1, 2, 3)]  # fmt: skip
    assert cluster_of(*nodes).leader("gpu.tiny").name == "rabbit@10.0.0.2"
    assert [n.asked for n in nodes] == [1, 0, 0]  # the first answer lists the cluster


def test_a_node_that_is_down_is_passed_over(clock):
    down = FakeNode(clock, "rabbit@10.0.0.1", lambda now: None)
    up = FakeNode(clock, "rabbit@10.0.0.3", lambda now: listing("rabbit@10.0.0.3"))
    assert cluster_of(down, up).leader("gpu.tiny") is up


def test_after_a_kill_the_old_leader_is_not_taken_for_the_new_one(clock):
    # Until its followers elect another (at 8 s), the listing still names the dead node.
    def answer(now: float) -> str:
        return listing("rabbit@10.0.0.1" if now < 8 else "rabbit@10.0.0.2")

    old = FakeNode(clock, "rabbit@10.0.0.1", lambda now: None)
    nodes = [old, *(FakeNode(clock, f"rabbit@10.0.0.{i}", answer) for i in (2, 3))]
    assert cluster_of(*nodes).leader("gpu.tiny", other_than=old).name == "rabbit@10.0.0.2"
    assert clock.now >= 8


def test_answers_without_a_leader_fail_after_the_timeout(clock):
    nodes = [FakeNode(clock, f"rabbit@10.0.0.{i}", lambda now: listing(None)) for i in (1, 2)]
    with pytest.raises(TimeoutError, match=r"no node leads gpu\.tiny") as failed:
        cluster_of(*nodes).leader("gpu.tiny", timeout=60)
    assert 60 < clock.now < 66
    assert "rabbit@10.0.0.1: rc 0" in str(failed.value)  # what each node last said


def test_a_cli_that_never_answers_fails_at_the_cap(clock):
    nodes = [FakeNode(clock, f"rabbit@10.0.0.{i}", lambda now: listing("rabbit@10.0.0.1"), 1e9)
             for i in (1, 2, 3)]  # fmt: skip
    with pytest.raises(TimeoutError, match="rc 124"):
        cluster_of(*nodes).leader("gpu.tiny", timeout=60)
    assert STALL_FACTOR * 60 < clock.now < STALL_FACTOR * 60 + 3 * 60 + 2
