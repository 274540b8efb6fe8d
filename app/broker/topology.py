"""The RabbitMQ topology, declared identically by every process that touches it."""

from __future__ import annotations

from collections.abc import Iterable

from kombu import Connection, Exchange, Queue

from app.db.enums import MAX_AMQP_PRIORITY

JOBS_EXCHANGE = Exchange("diffq.jobs", type="direct", durable=True)
DEAD_LETTER_EXCHANGE = Exchange("diffq.dlx", type="direct", durable=True)
# Webhook deliveries: consumed by CPU workers (`diffq webhooks`), never by a GPU worker.
WEBHOOK_QUEUE = "webhooks"


def dead_letter_queue_name(queue: str) -> str:
    return f"{queue}.dlq"


def queue_type() -> str:
    """DIFFQ_QUEUE_TYPE: classic (default) or quorum (replicated over a cluster)."""
    from app.config import load_settings

    return load_settings().queue_type


def work_queue(name: str, kind: str | None = None) -> Queue:
    """A durable queue whose rejects go to its own DLQ. Classic: with priorities. Quorum:
    replicated, dead-lettering at-least-once (the DLQ confirms before the message leaves);
    RabbitMQ before 4.0 has no priorities on quorum queues, so they are FIFO."""
    dead_letter = {
        "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE.name,
        "x-dead-letter-routing-key": dead_letter_queue_name(name),
    }
    if (kind or queue_type()) == "quorum":
        arguments = {
            "x-queue-type": "quorum",
            **dead_letter,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",  # required by at-least-once dead-lettering
        }
    else:
        arguments = {**dead_letter, "x-max-priority": MAX_AMQP_PRIORITY}
    return Queue(name, JOBS_EXCHANGE, routing_key=name, durable=True, queue_arguments=arguments)


def dead_letter_queue(name: str, kind: str | None = None) -> Queue:
    dlq = dead_letter_queue_name(name)
    arguments = {"x-queue-type": "quorum"} if (kind or queue_type()) == "quorum" else None
    return Queue(
        dlq, DEAD_LETTER_EXCHANGE, routing_key=dlq, durable=True, queue_arguments=arguments
    )


def declare_topology(
    connection: Connection, queues: Iterable[str], kind: str | None = None
) -> None:
    """Declare each work queue and its DLQ (a dead-lettered message needs its DLQ to exist);
    `kind`: the settings' queue_type (default: read from the environment)."""
    channel = connection.default_channel
    for name in queues:
        dead_letter_queue(name, kind)(channel).declare()
        work_queue(name, kind)(channel).declare()
