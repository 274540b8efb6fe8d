"""A raw Server-Sent Events reader for tests: keeps ids and comments, not just data."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import requests


@dataclass
class Event:
    event: str | None = None
    id: int | None = None
    data: dict | None = None
    comment: str | None = None
    at: float = field(default_factory=time.monotonic)


@dataclass
class Stream:
    status_code: int
    events: list[Event]
    closed_by_server: bool

    def named(self, name: str) -> list[Event]:
        return [e for e in self.events if e.event == name]


def read_stream(
    url: str,
    key: str,
    *,
    last_event_id: int | None = None,
    timeout: float = 60.0,
    stop=lambda events: False,
) -> Stream:
    """Read until the server closes the stream, `stop(events)` is true, or `timeout`."""
    headers = {"Authorization": f"Bearer {key}", "Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    events: list[Event] = []
    response = requests.get(url, headers=headers, stream=True, timeout=(5, timeout))
    if response.status_code != 200:
        return Stream(response.status_code, events, True)
    deadline = threading.Timer(timeout, response.close)
    deadline.start()
    current = Event()
    closed = False
    try:
        for line in response.iter_lines(decode_unicode=True):
            if line.startswith(":"):
                events.append(Event(comment=line[1:].strip()))
            elif line.startswith("id:"):
                current.id = int(line[3:].strip())
            elif line.startswith("event:"):
                current.event = line[6:].strip()
            elif line.startswith("data:"):
                current.data = json.loads(line[5:].strip())
            elif line == "" and (current.event or current.data is not None):
                current.at = time.monotonic()
                events.append(current)
                current = Event()
            if stop(events):
                break
        else:
            closed = True
    except (requests.ConnectionError, AttributeError):
        pass  # closed by our timer
    finally:
        deadline.cancel()
        response.close()
    return Stream(200, events, closed)
