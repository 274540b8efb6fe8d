"""The embedded broker of `diffq up`: kombu's filesystem transport under DIFFQ_HOME/broker,
with messages written atomically and named in the order they were sent. It needs no
server, and so has no confirms, no dead-letter queues, no priorities and no basic.get for
batches (`Embedded.features`).

kombu hands out a queue's messages in the order of their file names, sorted as text. A
name starts with the send time in nanoseconds since the epoch, zero-padded to a fixed
width (a bare number sorts "999" after "1000": FIFO broke each time the counter gained a
digit), kept increasing within a process even if the wall clock steps back, and survives
a restart of the machine (a monotonic clock would start again below the queued names).
The task id that follows (a job's id) lets a cancelled job's message be taken out of the
queue at once (`Embedded.discard`), so a cancelled batch's thousands of messages do not
hold the jobs sent after it."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

from app.broker.backend import Broker, Features
from app.config import EMBEDDED_BROKER_URL

STAMP_DIGITS = 20  # nanoseconds since 1970 fit in 19 digits until the year 2286
_last_stamp = 0
_stamp_lock = threading.Lock()


def next_stamp() -> int:
    """The wall clock in nanoseconds, strictly increasing within this process."""
    global _last_stamp
    with _stamp_lock:
        _last_stamp = max(time.time_ns(), _last_stamp + 1)
        return _last_stamp


def message_name(queue: str, task_id: str, stamp: int) -> str:
    return f"{stamp:0{STAMP_DIGITS}d}_{task_id}.{queue}.msg"


def _task_id(payload: dict) -> str:
    headers = payload.get("headers") or {}
    found = str(headers.get("id") or "")
    # Only a plain id goes into a file name; anything else gets a fresh one.
    return found if found and all(c.isalnum() or c == "-" for c in found) else str(uuid.uuid4())


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        # The stock transport creates the .msg file and then writes it, so a consumer
        # polling in between can take an empty file and lose the message. Writing under
        # a name no consumer matches and renaming makes the message appear whole.
        name = message_name(queue, _task_id(payload), next_stamp())
        final = os.path.join(self.data_folder_out, name)
        tmp = os.path.join(self.data_folder_out, f".{name}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(str_to_bytes(dumps(payload)))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)


class Transport(filesystem.Transport):
    Channel = Channel


# Every process whose broker URL has this scheme imports this module (app/broker/backend.py
# chooses the backend by it) before Celery connects, so the scheme resolves.
TRANSPORT_ALIASES[EMBEDDED_BROKER_URL.split(":", 1)[0]] = "app.broker.embedded:Transport"


class Embedded(Broker):
    name = "embedded"
    schemes = (EMBEDDED_BROKER_URL.split(":", 1)[0],)
    # None of them: no confirms, dead letters, priorities, depths or management API; and
    # no batches (a second message held by a process that dies is lost with it).
    features = Features()

    def discard(self, job_ids: Iterable[uuid.UUID]) -> int:
        """Take the waiting messages of these jobs (cancelled while queued) out of the
        queue folder, so that workers do not spend a poll on each of them before the jobs
        sent after; returns how many were taken. A message a worker already took is not
        there any more; one taken meanwhile is simply not found."""
        wanted = {str(job_id) for job_id in job_ids}
        if not wanted:
            return 0
        folder = Path(self.settings.broker_folder) / "queue"
        taken = 0
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return 0
        for name in names:
            if not name.endswith(".msg") or name.startswith("."):
                continue
            task_id = name.split("_", 1)[-1].split(".", 1)[0]
            if task_id in wanted:
                try:
                    os.unlink(folder / name)
                    taken += 1
                except FileNotFoundError:
                    pass  # a worker took it first: it will find its job cancelled
        return taken

    def transport_options(self) -> dict:
        folder = self.settings.broker_folder
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        return {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "control_folder": str(folder / "control"),
            "processed_folder": str(folder / "processed"),
            "store_processed": False,
            "polling_interval": 0.1,
        }
