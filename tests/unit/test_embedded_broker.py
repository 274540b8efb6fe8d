"""The embedded broker hands out a queue's messages in the order they were sent, whatever
the clock's digits, and takes a cancelled job's waiting message out of the queue."""

from __future__ import annotations

import uuid

import pytest
from kombu import Connection

from app.broker import embedded
from app.broker.embedded import Embedded
from app.config import load_settings


@pytest.fixture
def folder(tmp_path):
    for sub in ("queue", "processed", "control"):
        (tmp_path / "broker" / sub).mkdir(parents=True)
    return tmp_path


@pytest.fixture
def queue() -> str:
    # kombu's virtual transports remember bindings per process, not per folder: a queue
    # name of each test's own keeps its binding written in its own folder.
    return f"gpu.t{uuid.uuid4().hex[:8]}"


def _connection(folder) -> Connection:
    broker = Embedded(load_settings({"DIFFQ_HOME": str(folder)}))
    return Connection("diffqfs://", transport_options=broker.transport_options())


def _send(connection: Connection, queue: str, task_id: str) -> None:
    with connection.SimpleQueue(queue) as q:
        q.put({"n": task_id}, headers={"id": task_id})


def _received(connection: Connection, queue: str, count: int) -> list[str]:
    with connection.SimpleQueue(queue) as q:
        out = []
        for _ in range(count):
            message = q.get(timeout=2)
            out.append(message.payload["n"])
            message.ack()
        return out


@pytest.mark.parametrize(
    "stamps",
    [
        [999, 1000, 1001],  # the counter gains a digit
        [999_999_999_999, 1_000_000_000_000],  # 16.7 minutes of milliseconds, in ms
        [10**18 - 1, 10**18],  # nanoseconds since 1970 gain a digit in 2001
    ],
)
def test_messages_come_out_in_the_order_sent_across_a_new_digit(folder, queue, monkeypatch, stamps):
    clock = iter(stamps)
    monkeypatch.setattr(embedded.time, "time_ns", lambda: next(clock))
    monkeypatch.setattr(embedded, "_last_stamp", 0)
    connection = _connection(folder)
    sent = [f"job-{i}" for i in range(len(stamps))]
    for task_id in sent:
        _send(connection, queue, task_id)
    assert _received(connection, queue, len(sent)) == sent


def test_a_clock_stepping_back_keeps_the_order_of_one_process(folder, queue, monkeypatch):
    clock = iter([5_000, 4_000, 4_500])
    monkeypatch.setattr(embedded.time, "time_ns", lambda: next(clock))
    monkeypatch.setattr(embedded, "_last_stamp", 0)
    connection = _connection(folder)
    for task_id in ("a", "b", "c"):
        _send(connection, queue, task_id)
    assert _received(connection, queue, 3) == ["a", "b", "c"]


def test_discard_takes_only_the_named_jobs_messages(folder, queue):
    connection = _connection(folder)
    cancelled = [uuid.uuid4() for _ in range(3)]
    kept = uuid.uuid4()
    for job_id in [*cancelled, kept]:
        _send(connection, queue, str(job_id))
    broker = Embedded(load_settings({"DIFFQ_HOME": str(folder)}))
    assert broker.discard(cancelled) == len(cancelled)
    assert broker.discard(cancelled) == 0  # each message once
    assert _received(connection, queue, 1) == [str(kept)]
    with connection.SimpleQueue(queue) as q, pytest.raises(q.Empty):
        q.get(timeout=0.3)
