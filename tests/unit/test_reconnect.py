"""The worker's consumer (tasks/reconnect.py): worker-heartbeat events never retried in the
event loop, where a retry loop on a partitioned link would wedge it."""

from __future__ import annotations

from celery.worker.consumer import Consumer as CeleryConsumer

from tasks.reconnect import CELERY_HEART, Consumer, OneShotHeart


class RecordingEventer:
    enabled = True

    def __init__(self) -> None:
        self.on_enabled: set = set()
        self.on_disabled: set = set()
        self.sent: list[tuple[str, dict]] = []

    def send(self, event, **fields):
        self.sent.append((event, fields))


class NoTimer:
    def call_repeatedly(self, *_args, **_kwargs):
        return None


def test_the_consumer_starts_our_heart_in_place_of_celerys():
    assert CELERY_HEART in CeleryConsumer.Blueprint.default_steps
    steps = Consumer.Blueprint.default_steps
    assert CELERY_HEART not in steps
    assert steps.index("tasks.reconnect:Heart") == CeleryConsumer.Blueprint.default_steps.index(
        CELERY_HEART
    )


def test_every_heartbeat_event_is_sent_without_retries():
    eventer = RecordingEventer()
    heart = OneShotHeart(NoTimer(), eventer, interval=2.0)
    heart.start()  # worker-online
    heart._send("worker-heartbeat")  # what the timer calls
    heart._send("worker-heartbeat", retry=True)  # even when asked to
    heart.stop()  # worker-offline
    assert [event for event, _ in eventer.sent] == [
        "worker-online",
        "worker-heartbeat",
        "worker-heartbeat",
        "worker-offline",
    ]
    assert all(fields["retry"] is False for _, fields in eventer.sent)
