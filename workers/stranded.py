"""Stranded deliveries: jobs wait in PostgreSQL while a worker that consumes their queue
sits idle.

Every queued job has a message, so an idle consumer of its queue is handed one at once.
When that does not happen for `DIFFQ_STRANDED_AFTER` seconds, the broker holds the
messages somewhere they do nothing. RabbitMQ does this when a quorum queue's leader
changes at the wrong moment: the new leader's log says a message went to this worker's
consumer, which never received it (rabbitmq-server#15473). The consumer's one prefetch
slot stays taken, so the worker is sent nothing more, and while its channel lives the
message is never handed back: the job would wait for ever (the quorum cluster's leader
kill, tests/faults/test_quorum_cluster.py Q1, met it once in many runs).

The watch runs in a GPU worker's main process, beside its consumer:

1. idle (nothing active or reserved at any look, no task started between looks, consumer
   connected) for `after` seconds while jobs of its queues published at least that long
   ago (on the database's clock) are still queued: the worker cuts its
   broker connection (`Broker.reopen`). The broker takes back whatever it counts as
   delivered to it, and the consumer reconnects at once (tasks/reconnect.py);
2. still idle, and jobs still waiting, `after` seconds later: their messages are not in
   the broker at all. The jobs go back to the outbox (`published_at` cleared) and the
   relay publishes them again.

Step 2 only adds deliveries: a job's second message meets a running or finished job and
does nothing (workers/claim.py). Step 1 is harmless while the worker is truly idle; a
delivery arriving in the instant before the cut would be redelivered and its run taken
over (a second generation, no lost job), so the watch looks at the worker's state once
more, after the database answered, just before it cuts.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

log = logging.getLogger(__name__)


class StrandWatch:
    """The two steps above, one `tick` at a time (a thread calls it every `after / 4`)."""

    def __init__(
        self,
        *,
        after: float,
        busy: Callable[[], bool],
        consuming: Callable[[], bool],
        waiting: Callable[[float], list[uuid.UUID]],
        reopen: Callable[[], bool],
        republish: Callable[[list[uuid.UUID]], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.after = after
        self._busy = busy
        self._consuming = consuming
        self._waiting = waiting
        self._reopen = reopen
        self._republish = republish
        self._clock = clock
        self._idle_since = clock()
        self._reopened = False  # step 1 done for this idle spell
        self.reopened = 0
        self.republished = 0

    def tick(self) -> str | None:
        """One look; returns what it did ("reopened", "republished") or None."""
        now = self._clock()
        if self._busy():
            self._idle_since, self._reopened = now, False
            return None
        if not self._consuming():  # away from the broker: idleness says nothing
            self._idle_since = now
            return None
        if now - self._idle_since < self.after:
            return None
        stranded = self._waiting(self.after)
        if not stranded:
            self._idle_since, self._reopened = now, False
            return None
        if self._busy():  # a delivery came while the database was asked: not stranded
            self._idle_since, self._reopened = self._clock(), False
            return None
        self._idle_since = now
        if not self._reopened and self._reopen():
            self._reopened = True
            self.reopened += 1
            log.warning(
                "idle for %.0fs while %d job(s) of this worker's queues wait (first: %s): "
                "reopening the broker connection, so that the broker takes back "
                "deliveries it counts as this worker's",
                self.after,
                len(stranded),
                stranded[0],
            )
            return "reopened"
        count = self._republish(stranded)
        self._reopened = False
        self.republished += count
        log.warning(
            "idle while %d job(s) of this worker's queues wait (first: %s) and the broker "
            "hands it nothing: %d handed back to the outbox, the relay publishes them again",
            len(stranded),
            stranded[0],
            count,
        )
        return "republished"


def start(controller, services, queues: list[str]) -> threading.Thread | None:
    """The watch of a GPU worker's main process (tasks/boot/gpu.py); None when
    `DIFFQ_STRANDED_AFTER` is 0."""
    after = services.settings.stranded_after
    if after <= 0:
        return None
    from celery.worker import state

    from app.jobs import pauses, service
    from workers import forkguard, heartbeat

    accepted = [state.all_total_count[0]]

    def busy() -> bool:
        """Working now, or since the last look: the watch looks every `after / 4`
        seconds, and a worker that ran jobs between two looks was not idle."""
        seen, accepted[0] = accepted[0], state.all_total_count[0]
        return bool(state.active_requests or state.reserved_requests or seen != accepted[0])

    def waiting(seconds: float) -> list[uuid.UUID]:
        with services.db.session() as session:
            # A paused model's queue is not consumed on purpose (workers/pausing.py).
            held = pauses.paused_queues(services.catalog, pauses.paused(session))
            active = [queue for queue in queues if queue not in held]
            return service.stranded_job_ids(session, active, seconds) if active else []

    def connection():
        return getattr(getattr(controller, "consumer", None), "connection", None)

    def consuming() -> bool:
        # kombu's `_connection`: set while open (its `connection` property would connect).
        return heartbeat.consuming() and getattr(connection(), "_connection", None) is not None

    def reopen() -> bool:
        return services.broker.reopen(connection())

    def republish(job_ids: list[uuid.UUID]) -> int:
        with services.db.session() as session:
            return service.unpublish(session, job_ids)

    watch = StrandWatch(
        after=after,
        busy=busy,
        consuming=consuming,
        waiting=waiting,
        reopen=reopen,
        republish=republish,
    )

    def loop() -> None:
        while True:
            time.sleep(after / 4)
            try:
                with forkguard.ticking():
                    watch.tick()
            except Exception as exc:  # noqa: BLE001 - the database away: next tick
                log.info("stranded-delivery check skipped (%s: %s)", type(exc).__name__, exc)

    thread = threading.Thread(target=loop, name="stranded-watch", daemon=True)
    thread.start()
    return thread
