"""DIFFQ_QUEUE_TYPE=quorum: the work queue is a quorum queue whose rejected messages are
dead-lettered at-least-once into a quorum DLQ (on the suite's RabbitMQ, one node)."""

from __future__ import annotations

import time
import uuid

import pytest
from amqp.exceptions import PreconditionFailed

from app.broker.topology import declare_topology, queue_type, work_queue
from testbed.services import broker_connection

pytestmark = pytest.mark.services


def test_the_queue_type_setting(monkeypatch):
    monkeypatch.delenv("DIFFQ_QUEUE_TYPE", raising=False)
    assert queue_type() == "classic"
    assert "x-max-priority" in work_queue("q").queue_arguments
    monkeypatch.setenv("DIFFQ_QUEUE_TYPE", "quorum")
    arguments = work_queue("q").queue_arguments
    assert arguments["x-queue-type"] == "quorum"
    assert arguments["x-dead-letter-strategy"] == "at-least-once"
    assert "x-max-priority" not in arguments
    monkeypatch.setenv("DIFFQ_QUEUE_TYPE", "mirrored")
    with pytest.raises(ValueError, match="DIFFQ_QUEUE_TYPE"):
        queue_type()


def test_a_rejected_message_reaches_the_quorum_dlq(stack, monkeypatch):
    monkeypatch.setenv("DIFFQ_QUEUE_TYPE", "quorum")
    name = f"gpu.quorum-{uuid.uuid4().hex[:8]}"
    with broker_connection(stack.broker_url) as conn:
        declare_topology(conn, [name])
        channel = conn.channel()
        # It is a quorum queue: declaring it classic is refused as inequivalent.
        with pytest.raises(PreconditionFailed):
            work_queue(name, "classic")(channel).declare()
        channel = conn.channel()
        conn.Producer(channel).publish(
            {"v": 1}, exchange="diffq.jobs", routing_key=name, delivery_mode=2
        )
        message = None
        for _ in range(50):
            message = channel.basic_get(name)
            if message is not None:
                break
            time.sleep(0.1)
        assert message is not None
        channel.basic_reject(message.delivery_tag, requeue=False)
        dead = None
        for _ in range(50):
            dead = channel.basic_get(f"{name}.dlq", no_ack=True)
            if dead is not None:
                break
            time.sleep(0.1)
        assert dead is not None and '"v": 1' in str(dead.body)
        channel.queue_delete(name)
        channel.queue_delete(f"{name}.dlq")
