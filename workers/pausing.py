"""A GPU worker's main process follows the paused models (app/jobs/pauses.py): it stops
consuming a queue whose every model is paused and consumes it again once one is resumed.

The broker keeps the queue's messages meanwhile, and the database its jobs: nothing moves
while a model is paused. The consumer is changed the way Celery's own `cancel_consumer`
and `add_consumer` control commands change it, in the consumer's event loop (`call_soon`),
so a reconnection keeps the choice. A delivery that comes before the watch sees the pause
is held and handed back unclaimed (workers/execute.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


def hold_seconds(settings) -> float:
    """DIFFQ_PAUSE_POLL, at least 0.1 s: the watch's period, and how long a delivery of a
    paused model is held before it goes back (a shorter hold would spin on it)."""
    return max(0.1, settings.pause_poll)


class PauseWatch:
    """One `tick` at a time (a thread calls it every DIFFQ_PAUSE_POLL seconds).

    It only undoes what it did: a queue is added back only if this watch stopped it. A
    consumer that is not consuming a queue for another reason (reconnecting after the
    broker closed its channel, say) is Celery's to restore; adding the queue again then
    would open a second consumer on it, with deliveries beyond the prefetch.
    """

    def __init__(
        self,
        queues: list[str],
        *,
        paused_queues: Callable[[], set[str]],
        consuming: Callable[[str], bool | None],
        cancel: Callable[[str], None],
        add: Callable[[str], None],
    ) -> None:
        self.queues = list(queues)
        self._paused_queues = paused_queues
        self._consuming = consuming
        self._cancel = cancel
        self._add = add
        self.stopped: set[str] = set()  # the queues this watch stopped consuming

    def tick(self) -> dict[str, str]:
        """Bring each queue's consumer in line with the pauses; returns what changed
        ({queue: "stopped" | "started"})."""
        paused = self._paused_queues()
        changed = {}
        for queue in self.queues:
            if (queue in paused) == (queue in self.stopped):
                continue
            if self._consuming(queue) is None:  # no consumer now (away from the broker)
                continue
            if queue in paused:
                self._cancel(queue)
                self.stopped.add(queue)
                changed[queue] = "stopped"
            else:
                self._add(queue)
                self.stopped.discard(queue)
                changed[queue] = "started"
        for queue, what in changed.items():
            log.warning(
                "queue %s: %s consuming (%s)",
                queue,
                what,
                "every model of it is paused" if what == "stopped" else "its model resumed",
            )
        return changed


def start(controller, services, queues: list[str]) -> threading.Thread:
    """The watch of a GPU worker's main process (tasks/boot/gpu.py)."""
    poll = hold_seconds(services.settings)
    from app.jobs import pauses
    from workers import forkguard

    def consumer():
        return getattr(controller, "consumer", None)

    def consuming(queue: str) -> bool | None:
        tasks = getattr(consumer(), "task_consumer", None)
        return None if tasks is None else bool(tasks.consuming_from(queue))

    def paused_queues() -> set[str]:
        with services.db.session() as session:
            return pauses.paused_queues(services.catalog, pauses.paused(session))

    def cancel(queue: str) -> None:
        found = consumer()
        found.call_soon(found.cancel_task_queue, queue)

    def add(queue: str) -> None:
        found = consumer()
        found.call_soon(found.add_task_queue, queue)

    watch = PauseWatch(
        queues, paused_queues=paused_queues, consuming=consuming, cancel=cancel, add=add
    )

    def loop() -> None:
        while True:
            try:
                with forkguard.ticking():
                    watch.tick()
            except Exception as exc:  # noqa: BLE001 - the database away: next tick
                log.info("paused-model check skipped (%s: %s)", type(exc).__name__, exc)
            time.sleep(poll)

    thread = threading.Thread(target=loop, name="pause-watch", daemon=True)
    thread.start()
    return thread
