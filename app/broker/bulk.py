"""Publishing many jobs at once (a batch's chunk): every message put on the channel
without waiting, then the broker's confirms awaited together.

A single submit waits for its one confirm (`Publisher.publish`); a chunk of a thousand
jobs waiting a round trip each would spend most of its time idle. Here the channel is
in confirm mode, the messages go out back to back, and RabbitMQ's acks (which may
cover several delivery tags at once, `multiple`) are read until every tag is settled.
Only confirmed jobs are returned, so only they are marked published: anything else is
the outbox's (the relay republishes unconfirmed jobs), exactly as for one job.

A backend without confirms (the embedded broker) publishes one at a time through the
publisher's ordinary path.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence

from app.broker.publish import Publisher
from app.catalog import ModelSpec
from app.db.models.jobs import Job

log = logging.getLogger(__name__)


class BulkPublisher:
    """One connection of its own (opened on first use, closed by `close`), for one
    ingest; not shared between threads."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self._conn = None
        self._channel = None
        self._published = 0  # delivery tags handed out on the channel
        self._acked = 0  # every delivery tag up to here is settled
        self._single: set[int] = set()  # settled one by one, beyond `_acked`
        self._nacked: set[int] = set()
        self._broken = False

    def publish(self, jobs: Sequence[Job], specs: dict[str, ModelSpec]) -> list[uuid.UUID]:
        """Send every job's message; the ids whose publish the broker confirmed."""
        if not jobs or self._broken:
            return []
        if not self.publisher.broker.features.confirms:
            return [j.id for j in jobs if self.publisher.publish(j, specs.get(j.model))]
        try:
            return self._publish_confirmed(jobs, specs)
        except Exception as exc:  # noqa: BLE001 - any broker failure: the relay has them
            log.warning(
                "bulk publish of %d job(s) failed (%s: %s); the relay will publish them",
                len(jobs),
                type(exc).__name__,
                exc,
            )
            self._broken = True  # the rest of this ingest is left to the relay too
            self.close()
            return []

    def _open(self):
        if self._channel is None:
            self.publisher._ensure_topology()
            self._conn = self.publisher.celery.connection_for_write()
            self._conn.ensure_connection(max_retries=1, timeout=self.publisher.timeout)
            channel = self._conn.default_channel
            channel.confirm_select()
            channel.events["basic_ack"].add(self._on_ack)
            channel.events["basic_nack"].add(self._on_nack)
            self._channel = channel
        return self._channel

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        if multiple:
            self._acked = max(self._acked, delivery_tag)
        elif delivery_tag == self._acked + 1:
            self._acked = delivery_tag
        else:
            self._single.add(delivery_tag)
        while self._acked + 1 in self._single:
            self._single.discard(self._acked + 1)
            self._acked += 1

    def _on_nack(self, delivery_tag: int, multiple: bool, *_args) -> None:
        first = self._acked + 1 if multiple else delivery_tag
        self._nacked.update(range(first, delivery_tag + 1))
        self._on_ack(delivery_tag, multiple)

    def _publish_confirmed(
        self, jobs: Sequence[Job], specs: dict[str, ModelSpec]
    ) -> list[uuid.UUID]:
        channel = self._open()
        first = self._published + 1
        for job in jobs:
            body, priority, content_type, encoding, headers, props = self.publisher.job_message(
                job, specs.get(job.model)
            )
            message = channel.prepare_message(
                body, priority, content_type, encoding, headers, props
            )
            channel._basic_publish(message, exchange="", routing_key=job.queue)
            self._published += 1
        last = self._published
        deadline = time.monotonic() + self.publisher.timeout + 0.002 * len(jobs)
        while self._acked < last:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{last - self._acked} confirm(s) still awaited")
            self._conn.connection.drain_events(timeout=left)
        return [job.id for tag, job in enumerate(jobs, first) if tag not in self._nacked]

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.release()
            except Exception:
                log.debug("closing the bulk publisher's connection failed", exc_info=True)
        self._conn = self._channel = None
