"""Further messages of a batching model's queue, for workers/batch.py.

The Celery consumer keeps a prefetch of one for every queue; a batch takes its other
messages itself, with basic.get on a channel of its own, so that only a batching model's
queue ever has more than one message in this worker's hands (at most `max_batch`), and
each of them is acked on its own once its job's outcome is durable. Closing the channel
(or losing the process) hands every message still unacked back to RabbitMQ.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu import Producer, Queue

from app.jobs.payload import GENERATE_TASK

log = logging.getLogger(__name__)


class BrokerPermit:
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
    """basic.get on one queue, on a connection of its own (closed after the batch)."""

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


def opener(celery_app: Any):
    """`open_permits(queue)` for workers.execute.execute_job."""
    return lambda queue: BrokerPermits(celery_app, queue)
