"""A Celery consumer that reconnects to a broker that came back within a second or two.

Celery's consumer reconnects with kombu's fixed back-off (2 s, then 4, 6, 8 … up to
30 s between tries), so a broker back after a 5 s crash waits up to 12 s for the next
try. Here the tries come every 0.5 s at first and at most every 2 s (a reconnect is a
TCP connect and an AMQP handshake to one node; cheap for the broker).
"""

from __future__ import annotations

import functools

from celery.worker.consumer import Consumer as CeleryConsumer

RECONNECT_START = 0.5
RECONNECT_STEP = 0.5
RECONNECT_MAX = 2.0


class Consumer(CeleryConsumer):
    def ensure_connected(self, conn):
        conn.ensure_connection = functools.partial(
            type(conn).ensure_connection,
            conn,
            interval_start=RECONNECT_START,
            interval_step=RECONNECT_STEP,
            interval_max=RECONNECT_MAX,
        )
        return super().ensure_connected(conn)
