"""A worker's liveness: its own event loop is turning, whatever the broker is doing.

A Celery consumer bootstep beats every BEAT_SECONDS from the worker's event loop (the
main process's hub, which keeps turning while a pool child runs a job). The worker's
`/healthz` (on its metrics port) answers 503 only when the consumer is connected and the
loop has not beaten for STALE_SECONDS: the loop is wedged and a restart helps. While the
consumer is away from the broker (connecting, reconnecting, stopping) it answers 200
with that state: a broker outage is not the worker's fault, and restarting every GPU
pod for it would reload every model for nothing.
"""

from __future__ import annotations

import json
import threading
import time

from celery import bootsteps

BEAT_SECONDS = 5.0
STALE_SECONDS = 60.0

_lock = threading.Lock()
_state = {"state": "starting", "beat": time.monotonic()}


def beat() -> None:
    with _lock:
        _state["state"] = "consuming"
        _state["beat"] = time.monotonic()


def set_state(state: str) -> None:
    with _lock:
        _state["state"] = state
        _state["beat"] = time.monotonic()


def consuming() -> bool:
    """Whether the consumer is connected and its loop turning now."""
    with _lock:
        return _state["state"] == "consuming"


def health(now: float | None = None) -> tuple[int, dict]:
    """(HTTP status, body) for GET /healthz."""
    with _lock:
        state, last = _state["state"], _state["beat"]
    age = (time.monotonic() if now is None else now) - last
    alive = state != "consuming" or age < STALE_SECONDS
    body = {"status": "ok" if alive else "stalled", "state": state, "last_beat_age": round(age, 1)}
    return (200 if alive else 503), body


def wsgi_health(_environ, start_response):
    status, body = health()
    start_response(
        f"{status} {'OK' if status == 200 else 'Service Unavailable'}",
        [("Content-Type", "application/json")],
    )
    return [json.dumps(body).encode()]


class Heartbeat(bootsteps.StartStopStep):
    """Started by the consumer once it is connected; stopped when the connection is lost
    (the consumer restarts its steps after reconnecting) and at shutdown."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent, **kwargs) -> None:
        super().__init__(parent, **kwargs)
        self._timer = None

    def start(self, parent) -> None:
        beat()
        self._timer = parent.timer.call_repeatedly(BEAT_SECONDS, beat)

    def stop(self, parent) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        set_state("reconnecting")

    def shutdown(self, parent) -> None:
        self.stop(parent)
        set_state("stopping")
