"""The stranded-delivery watch of a GPU worker (workers/stranded.py), step by step on a
clock of its own: idle with jobs waiting, the worker first reopens its broker connection,
then, still idle with the jobs still waiting, hands them back to the outbox; work, a
broker away or nothing waiting start the count again."""

from __future__ import annotations

import uuid

from workers.stranded import StrandWatch

AFTER = 10.0


class World:
    """What the watch asks about: the worker's state, the waiting jobs, its actions."""

    def __init__(self, reopens: bool = True) -> None:
        self.now = 0.0
        self.busy = False
        self.consuming = True
        self.waiting: list[uuid.UUID] = [uuid.uuid4(), uuid.uuid4()]
        self.asked: list[float] = []
        self.reopens = reopens
        self.actions: list[str] = []

    def watch(self) -> StrandWatch:
        return StrandWatch(
            after=AFTER,
            busy=lambda: self.busy,
            consuming=lambda: self.consuming,
            waiting=self._waiting,
            reopen=self._reopen,
            republish=self._republish,
            clock=lambda: self.now,
        )

    def _waiting(self, seconds: float) -> list[uuid.UUID]:
        self.asked.append(seconds)
        return list(self.waiting)

    def _reopen(self) -> bool:
        self.actions.append("reopen")
        return self.reopens

    def _republish(self, job_ids) -> int:
        self.actions.append(f"republish {len(job_ids)}")
        return len(job_ids)

    def run(self, watch: StrandWatch, until: float, step: float = 1.0) -> list[str]:
        done = []
        while self.now < until:
            self.now += step
            action = watch.tick()
            if action:
                done.append(f"{self.now:g} {action}")
        return done


def test_idle_with_jobs_waiting_reopens_then_republishes():
    world = World()
    watch = world.watch()
    assert world.run(watch, 9) == []  # not idle long enough yet
    assert world.asked == []  # and the database was not asked
    assert world.run(watch, 30) == ["10 reopened", "20 republished", "30 reopened"]
    assert world.actions == ["reopen", "republish 2", "reopen"]
    assert world.asked == [AFTER] * 3  # jobs published at least `after` seconds ago
    assert (watch.reopened, watch.republished) == (2, 2)


def test_work_restarts_the_count_and_the_steps():
    world = World()
    watch = world.watch()
    world.run(watch, 10)
    assert world.actions == ["reopen"]
    world.busy = True  # the reopened consumer got its delivery
    world.run(watch, 15)
    world.busy = False
    assert world.run(watch, 40) == ["25 reopened", "35 republished"]


def test_nothing_waiting_means_nothing_done():
    world = World()
    world.waiting = []
    watch = world.watch()
    assert world.run(watch, 60) == []
    assert world.actions == []
    assert len(world.asked) >= 5  # it kept looking while idle


def test_a_consumer_away_from_the_broker_is_not_idle():
    world = World()
    world.consuming = False
    watch = world.watch()
    assert world.run(watch, 60) == []
    assert world.asked == []
    world.consuming = True
    assert world.run(watch, 70) == ["70 reopened"]


def test_a_broker_that_cannot_reopen_has_the_jobs_republished_at_once():
    world = World(reopens=False)
    watch = world.watch()
    assert world.run(watch, 20) == ["10 republished", "20 republished"]
    assert world.actions == ["reopen", "republish 2", "reopen", "republish 2"]


def test_a_delivery_while_the_database_is_asked_stops_the_cut():
    """Idle at the first look, busy by the time the database has answered: a job just
    arrived, and cutting the connection now would hand its run to another worker."""
    world = World()
    watch = world.watch()
    asked = world._waiting

    def waiting(seconds: float) -> list[uuid.UUID]:
        world.busy = True  # the delivery lands during the query
        return asked(seconds)

    watch._waiting = waiting
    assert world.run(watch, 12) == []
    assert world.actions == [] and world.asked  # asked, and did nothing
    world.busy = False
    watch._waiting = asked
    assert world.run(watch, 30) == ["22 reopened"]  # the count began again after the work
