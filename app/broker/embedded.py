"""The embedded broker of `diffq up`: kombu's filesystem transport under DIFFQ_HOME/broker,
with messages written atomically. It needs no server, and so has no confirms, no
dead-letter queues, no priorities and no basic.get for batches (`Embedded.features`)."""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

from app.broker.backend import Broker, Features
from app.config import EMBEDDED_BROKER_URL


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        # The stock transport creates the .msg file and then writes it, so a consumer
        # polling in between can take an empty file and lose the message. Writing under
        # a name no consumer matches and renaming makes the message appear whole.
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
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
    features = Features(
        confirms=False,
        dead_letters=False,
        priorities=False,
        # A second message held by a process that dies is lost with it: no batches.
        batching=False,
        depths=False,
        management=False,
    )

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
