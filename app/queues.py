"""The RabbitMQ topology, declared identically by every process that touches it."""

from __future__ import annotations

from collections.abc import Iterable

from kombu import Connection, Exchange, Queue

from app.jobs.states import MAX_AMQP_PRIORITY

JOBS_EXCHANGE = Exchange("diffq.jobs", type="direct", durable=True)
DEAD_LETTER_EXCHANGE = Exchange("diffq.dlx", type="direct", durable=True)
# Webhook deliveries: consumed by CPU workers (`diffq webhooks`), never by a GPU worker.
WEBHOOK_QUEUE = "webhooks"


def dead_letter_queue_name(queue: str) -> str:
    return f"{queue}.dlq"


def work_queue(name: str) -> Queue:
    """A durable classic queue with priorities whose rejects go to its own DLQ."""
    return Queue(
        name,
        JOBS_EXCHANGE,
        routing_key=name,
        durable=True,
        queue_arguments={
            "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE.name,
            "x-dead-letter-routing-key": dead_letter_queue_name(name),
            "x-max-priority": MAX_AMQP_PRIORITY,
        },
    )


def dead_letter_queue(name: str) -> Queue:
    dlq = dead_letter_queue_name(name)
    return Queue(dlq, DEAD_LETTER_EXCHANGE, routing_key=dlq, durable=True)


def declare_topology(connection: Connection, queues: Iterable[str]) -> None:
    """Declare each work queue and its DLQ (a dead-lettered message needs its DLQ to exist)."""
    channel = connection.default_channel
    for name in queues:
        dead_letter_queue(name)(channel).declare()
        work_queue(name)(channel).declare()
