"""The embedded broker: kombu's filesystem transport, with messages written atomically."""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

from app.config import EMBEDDED_BROKER_URL, Settings


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


# Every process that builds the Celery app imports this module (through celeryconfig),
# so the scheme of EMBEDDED_BROKER_URL resolves everywhere.
TRANSPORT_ALIASES[EMBEDDED_BROKER_URL.split(":", 1)[0]] = "app.broker.embedded:Transport"


def transport_options(settings: Settings) -> dict:
    folder = settings.broker_folder
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
