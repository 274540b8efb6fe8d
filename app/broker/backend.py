"""The broker behind one interface: what diffq asks of a message broker, what each backend
can do, and the choice of backend by the broker URL's scheme (as Celery and kombu choose
transports).

Two backends: `RabbitMQ` (app/broker/rabbitmq.py: amqp://, amqps://, pyamqp://) and the
embedded filesystem broker of `diffq up` (app/broker/embedded.py: diffqfs://). The rest
of diffq asks the backend, never the URL: a backend without a feature says so in
`features`, and each caller decides what to do without it (the embedded broker runs every
job alone, keeps no dead letters and reports no queue depths). Adding a backend is one
module with a `Broker` subclass and its line in `BACKENDS` (docs/architecture.md, "How
to add a broker").
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from app.broker.topology import work_queue

if TYPE_CHECKING:
    from app.config import Settings
    from app.db.models.jobs import Job


@dataclass(frozen=True)
class Features:
    """What a backend can do beyond taking and handing out persistent messages (none of
    it unless said)."""

    confirms: bool = False  # a publish returns once the broker has the message
    dead_letters: bool = False  # rejected messages go to a dead-letter queue operators browse
    priorities: bool = False  # AMQP priorities on the work queues
    batching: bool = False  # a batch takes further messages of its queue (basic.get)
    depths: bool = False  # ready messages, consumers and dead letters per queue can be read
    management: bool = False  # an HTTP management API beside it (Flower's broker tab)

    @classmethod
    def every(cls) -> Features:
        return cls(**{name: True for name in cls.__dataclass_fields__})


class Unsupported(RuntimeError):
    """The backend cannot do what was asked (see its `features`)."""


class Broker:
    """One backend. `settings` are the process's; operations that talk to the broker take
    the Celery app's connection factory, so every process keeps one connection pool."""

    name: ClassVar[str]
    schemes: ClassVar[tuple[str, ...]]
    features: ClassVar[Features]

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def celery_settings(self, queues: Iterable[str], default_queue: str) -> dict[str, Any]:
        """Celery's broker settings: the URL, the transport's options, the queues."""
        return {
            "broker_url": self.settings.broker_url,
            "broker_transport_options": self.transport_options(),
            "broker_connection_timeout": self.settings.publish_timeout,  # a submit waits this
            "task_queues": [work_queue(name, self.settings.queue_type) for name in queues],
            "task_default_queue": default_queue,
        }

    def transport_options(self) -> dict[str, Any]:
        return {}

    def declare(self, connection: Any, queues: Iterable[str]) -> None:
        """Declare the work queues (and what they need, e.g. their DLQs) before use."""

    def dead_letter(self, celery_app: Any, job: Job, reason: str) -> bool:
        """Put a dead letter for `job` whose message was already acked (a failure after
        the hand-over to post-processing); False where the backend keeps none."""
        return False

    def discard(self, job_ids: Iterable[Any]) -> int:
        """Remove the waiting messages of jobs cancelled while queued, where the backend
        can (the embedded broker); elsewhere a worker acks each when it comes (RabbitMQ
        cannot take a message out of the middle of a queue). Returns how many went."""
        return 0

    def permits(self, celery_app: Any, queue: str) -> Any:
        """Further messages of `queue` for a batch (workers/gather.py `PermitSource`)."""
        raise Unsupported(f"the {self.name} broker does not batch")

    def reopen(self, connection: Any) -> bool:
        """Cut a consumer's connection (a kombu Connection) as a broker restart would, so
        that the broker takes back every delivery it counts as that consumer's, and the
        consumer reconnects (workers/stranded.py). False where the backend cannot: the
        caller has the waiting jobs published again instead."""
        return False

    def management_url(self) -> str | None:
        """Its HTTP management API (Flower's broker tab), where it has one."""
        return None


# Every backend, by module and class: imported only when its scheme is asked for.
BACKENDS = {
    "rabbitmq": "app.broker.rabbitmq:RabbitMQ",
    "embedded": "app.broker.embedded:Embedded",
}


def backend_classes() -> list[type[Broker]]:
    classes = []
    for target in BACKENDS.values():
        module, _, name = target.partition(":")
        classes.append(getattr(importlib.import_module(module), name))
    return classes


def broker_for(settings: Settings) -> Broker:
    """The backend for the settings' broker URL, by its scheme."""
    scheme = urlsplit(settings.broker_url).scheme.lower()
    for cls in backend_classes():
        if scheme in cls.schemes:
            return cls(settings)
    known = sorted(s for cls in backend_classes() for s in cls.schemes)
    raise ValueError(
        f"DIFFQ_BROKER_URL: no broker backend for scheme {scheme!r} (known: {', '.join(known)})"
    )
