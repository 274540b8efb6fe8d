"""RabbitMQ, the production broker: publisher confirms, a dead-letter exchange with a DLQ
per work queue, priorities (classic queues), basic.get for batches, queue depths, and the
management API beside it."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from kombu import Producer, Queue

from app.broker.backend import Broker, Features
from app.broker.payload import GENERATE_TASK, build_payload
from app.broker.topology import (
    DEAD_LETTER_EXCHANGE,
    JOBS_EXCHANGE,
    dead_letter_queue_name,
    declare_topology,
)

log = logging.getLogger(__name__)


class RabbitMQ(Broker):
    name = "rabbitmq"
    schemes = ("amqp", "amqps", "pyamqp")
    features = Features.every()

    def transport_options(self) -> dict[str, Any]:
        # Publisher confirms: a publish returns only once RabbitMQ has the message.
        return {"confirm_publish": True}

    def declare(self, connection: Any, queues: Iterable[str]) -> None:
        declare_topology(connection, queues, self.settings.queue_type)

    def dead_letter(self, celery_app: Any, job: Any, reason: str) -> bool:
        """The dead letter the inline path would have left, with RabbitMQ's x-death
        shape, so operators list and requeue it the same way (`celery -A tasks dlq`)."""
        death = {
            "reason": "rejected",
            "count": 1,
            "queue": job.queue,
            "exchange": JOBS_EXCHANGE.name,
            "routing-keys": [job.queue],
            "time": datetime.now(UTC).replace(microsecond=0),
        }
        try:
            celery_app.send_task(
                GENERATE_TASK,
                args=[build_payload(job)],
                task_id=str(job.id),
                exchange=DEAD_LETTER_EXCHANGE.name,
                routing_key=dead_letter_queue_name(job.queue),
                headers={"x-death": [death]},
                argsrepr=f"job_id={job.id}",
                kwargsrepr="{}",
                retry=True,
            )
        except Exception:
            log.exception("job %s failed (%s); its dead letter was not written", job.id, reason)
            return False
        return True

    def permits(self, celery_app: Any, queue: str) -> BrokerPermits:
        return BrokerPermits(celery_app, queue)

    def reopen(self, connection: Any) -> bool:
        """Shut the consumer connection's socket down: the broker sees the connection go,
        returns what its channels held (deliveries that never arrived included), and the
        consumer's own reconnect (tasks/reconnect.py) opens a fresh one."""
        # kombu's `connection` property would connect a closed one, from this thread:
        # only an open connection's socket is shut down.
        transport = getattr(getattr(connection, "_connection", None), "transport", None)
        sock = getattr(transport, "sock", None)
        if sock is None:
            return False
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            return False  # already gone: the consumer is reconnecting anyway
        return True

    def management_url(self) -> str | None:
        """RabbitMQ's management API beside the broker URL (same host and user, port
        15672), unless DIFFQ_RABBITMQ_API_URL names it."""
        if self.settings.rabbitmq_api_url:
            return self.settings.rabbitmq_api_url
        parts = urlsplit(self.settings.broker_url)
        user = quote(unquote(parts.username or "guest"), safe="")
        password = quote(unquote(parts.password or "guest"), safe="")
        return f"http://{user}:{password}@{parts.hostname or '127.0.0.1'}:15672/api/"


class BrokerPermit:
    """One further message taken for a batch, unacked until its job's outcome is durable."""

    def __init__(self, message: Any, producer: Any, queue: str) -> None:
        self._message = message
        self._producer = producer
        self._queue = queue
        self.redelivered = bool(message.delivery_info.get("redelivered"))
        self.payload = self._payload(message)

    @staticmethod
    def _payload(message: Any) -> Any:
        """The task's first argument (Celery's message protocol 2), or None."""
        if (message.headers or {}).get("task") != GENERATE_TASK:
            return None
        try:
            args = message.decode()[0]
        except Exception:  # noqa: BLE001 - not ours to judge: the ordinary path does
            return None
        return args[0] if args else None

    def ack(self) -> None:
        self._message.ack()

    def reject(self, requeue: bool) -> None:
        self._message.reject(requeue=requeue)

    def pass_back(self) -> None:
        """Return a message the batch does not use, as it came.

        A requeue would mark it redelivered, which the ordinary path reads as "its
        worker died: take over the job it started". A fresh copy is published (confirmed)
        before the original is acked; a crash in between leaves a duplicate, which the
        claim absorbs. A message already redelivered goes back as it is.
        """
        message = self._message
        if self.redelivered:
            message.reject(requeue=True)
            return
        properties = message.properties or {}
        self._producer.publish(
            message.body,
            exchange="",
            routing_key=self._queue,
            headers=message.headers,
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            delivery_mode=properties.get("delivery_mode", 2),
            priority=properties.get("priority"),
            correlation_id=properties.get("correlation_id"),
            retry=False,
        )
        message.ack()


class BrokerPermits:
    """basic.get on one queue, on a connection of its own (closed after the batch), so
    that only a batching model's queue ever has more than one message in a worker's
    hands (at most `max_batch`). Closing the connection (or losing the process) hands
    every message still unacked back to RabbitMQ."""

    def __init__(self, celery_app: Any, queue: str) -> None:
        self._connection = celery_app.connection_for_read(heartbeat=0)
        self._connection.ensure_connection(max_retries=1)
        self._channel = self._connection.channel()
        self._queue = Queue(queue, no_declare=True)(self._channel)
        self._name = queue
        self._producer = Producer(self._channel)

    def fetch(self) -> BrokerPermit | None:
        message = self._queue.get(no_ack=False, accept=["json"])
        if message is None:
            return None
        return BrokerPermit(message, self._producer, self._name)

    def close(self) -> None:
        try:
            self._connection.release()
        except Exception as exc:  # noqa: BLE001 - its messages come back either way
            log.warning("closing the batch's broker connection failed: %s", exc)
