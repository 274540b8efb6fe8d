"""Pausing models (app/jobs/pauses.py) without a database: which queues stop, which
pauses are refused, and the worker's watch that follows them (workers/pausing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.catalog import Catalog, tiny_spec
from app.jobs.pauses import PauseRefused, check, paused_queues
from workers.pausing import PauseWatch


def _catalog() -> Catalog:
    specs = [
        tiny_spec(Path("/m/a"), name="a", queue="gpu.a"),
        tiny_spec(Path("/m/b"), name="b", queue="gpu.pool"),
        tiny_spec(Path("/m/c"), name="c", queue="gpu.pool"),
    ]
    return Catalog(models={s.name: s for s in specs}, default_model="a")


def test_a_queue_stops_only_when_every_model_of_it_is_paused():
    catalog = _catalog()
    assert paused_queues(catalog, []) == set()
    assert paused_queues(catalog, ["a"]) == {"gpu.a"}
    assert paused_queues(catalog, ["b"]) == set()  # c still runs on gpu.pool
    assert paused_queues(catalog, ["b", "c"]) == {"gpu.pool"}


def test_a_pause_that_would_stop_another_model_is_refused_naming_it():
    catalog = _catalog()
    check(catalog, ["a"], [], "pause")
    check(catalog, ["b", "c"], [], "pause")
    check(catalog, ["b"], ["c"], "pause")  # c already paused
    with pytest.raises(PauseRefused, match=r"gpu\.pool also serves c: pause them together"):
        check(catalog, ["b"], [], "pause")
    with pytest.raises(PauseRefused) as unknown:
        check(catalog, ["nope"], [], "pause")
    assert unknown.value.unknown and "known: a, b, c" in str(unknown.value)


class FakeConsumer:
    def __init__(self, queues):
        self.consuming = set(queues)
        self.calls = []

    def cancel(self, queue):
        self.calls.append(("cancel", queue))
        self.consuming.discard(queue)

    def add(self, queue):
        self.calls.append(("add", queue))
        self.consuming.add(queue)


def _watch(consumer, paused, connected=lambda: True):
    return PauseWatch(
        ["gpu.a", "gpu.pool"],
        paused_queues=lambda: set(paused),
        consuming=lambda q: (q in consumer.consuming) if connected() else None,
        cancel=consumer.cancel,
        add=consumer.add,
    )


def test_the_watch_stops_and_starts_consuming_as_models_are_paused_and_resumed():
    consumer, paused = FakeConsumer(["gpu.a", "gpu.pool"]), set()
    watch = _watch(consumer, paused)
    assert watch.tick() == {}
    paused.add("gpu.a")
    assert watch.tick() == {"gpu.a": "stopped"}
    assert watch.tick() == {}  # already stopped: nothing asked twice
    assert consumer.consuming == {"gpu.pool"}
    paused.clear()
    assert watch.tick() == {"gpu.a": "started"}
    assert consumer.calls == [("cancel", "gpu.a"), ("add", "gpu.a")]


def test_the_watch_leaves_a_consumer_away_from_the_broker_alone():
    consumer, paused = FakeConsumer(["gpu.a", "gpu.pool"]), {"gpu.a"}
    connected = [False]
    watch = _watch(consumer, paused, connected=lambda: connected[0])
    assert watch.tick() == {}
    connected[0] = True  # reconnected: the pause is applied then
    assert watch.tick() == {"gpu.a": "stopped"}


def test_the_watch_only_adds_back_a_queue_it_stopped():
    """A queue not consumed for another reason (a reconnection under way) is Celery's to
    restore: adding it too would open a second consumer on it."""
    consumer, paused = FakeConsumer(["gpu.a"]), set()  # gpu.pool not consumed just now
    watch = _watch(consumer, paused)
    assert watch.tick() == {} and watch.tick() == {}
    assert consumer.calls == []
