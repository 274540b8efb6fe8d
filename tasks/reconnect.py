"""A Celery consumer that reconnects to a broker that came back within a second or two.

Celery's consumer reconnects with kombu's fixed back-off (2 s, then 4, 6, 8 … up to
30 s between tries), so a broker back after a 5 s crash waits up to 12 s for the next
try. Here the tries come every 0.5 s at first and at most every 2 s (a reconnect is a
TCP connect and an AMQP handshake to one node; cheap for the broker).

Its `worker-heartbeat` events (for Flower) are sent without retries. Celery sends them
from the worker's event loop with `retry=True` and no retry policy: kombu then reconnects
the event connection forever, inside the loop. On a partition from the broker (packets
dropped, nothing refused) the loop stayed there until the link healed: no AMQP heartbeat
was checked, so the worker never noticed the lost connection, never reconnected while it
lasted, and its /healthz turned 503 after a minute (found by the partition scenarios,
tests/faults/test_partitions.py, N1). A heartbeat event is worth nothing late: one that
cannot go now is dropped (buffered by the dispatcher), and the next comes in 2 s.
"""

from __future__ import annotations

import functools

from celery.worker import heartbeat
from celery.worker.consumer import Consumer as CeleryConsumer
from celery.worker.consumer import heart

RECONNECT_START = 0.5
RECONNECT_STEP = 0.5
RECONNECT_MAX = 2.0


CELERY_HEART = "celery.worker.consumer.heart:Heart"


class OneShotHeart(heartbeat.Heart):
    """Celery's worker-heartbeat timer, each event sent once (`worker-online`, each beat,
    `worker-offline`), never retried in the event loop."""

    def _send(self, event, retry=False):
        return super()._send(event, retry=False)


class Heart(heart.Heart):
    """Celery's Heart bootstep, starting a `OneShotHeart`."""

    def start(self, c):
        c.heart = OneShotHeart(c.timer, c.event_dispatcher, self.heartbeat_interval)
        c.heart.start()


class Consumer(CeleryConsumer):
    class Blueprint(CeleryConsumer.Blueprint):
        default_steps = [
            "tasks.reconnect:Heart" if step == CELERY_HEART else step
            for step in CeleryConsumer.Blueprint.default_steps
        ]

    def ensure_connected(self, conn):
        conn.ensure_connection = functools.partial(
            type(conn).ensure_connection,
            conn,
            interval_start=RECONNECT_START,
            interval_step=RECONNECT_STEP,
            interval_max=RECONNECT_MAX,
        )
        return super().ensure_connected(conn)
