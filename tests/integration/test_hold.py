"""The hold (workers/hold.py, app/jobs/residency.py), on PostgreSQL and on the embedded
SQLite: a free worker leaves a job whose model it does not hold to a busy worker that
holds it, for at most DIFFQ_WARM_HOLD_SECONDS after the job was queued; never for an
idle holder, a holder whose lease lapsed, or a job past the bound; and a message whose
only jobs are held waits, holding nothing, then claims."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import select, update

from app.db.models.fleet import HeldModel
from app.db.models.jobs import Job
from app.db.types import utcnow
from app.jobs import residency, service, transitions
from app.jobs.states import JobStatus, Priority
from app.keys import get_or_create_tenant
from app.metrics.instruments import WORKER_HOLD_SECONDS
from testbed.factories import job_request
from workers import hold
from workers.claim import claim_for_message

pytestmark = pytest.mark.services

BOUND = 20.0


class _Worker(SimpleNamespace):
    """What the claim reads of a worker runtime: `holds` are its loaded models."""

    def __init__(self, owner: str, holds: tuple[str, ...], bound: float = BOUND) -> None:
        settings = SimpleNamespace(
            max_attempts=5,
            lease_seconds=30,
            fair_share=True,
            fair_share_window=600.0,
            warm_hold_seconds=bound,
        )
        super().__init__(
            owner=owner,
            settings=settings,
            warmth=lambda: None,
            models=SimpleNamespace(held=lambda: [(name, None) for name in holds]),
            draining=threading.Event(),
            hand_back_requested=threading.Event(),
        )


class _Pool:
    """A queue and models of its own (`x`, `y`, `z`: other tests' workers hold none of
    them), one tenant, and worker `busy` holding model `x` while it runs an `x` job under
    a live lease."""

    def __init__(self, database) -> None:
        self.db = database
        run = uuid.uuid4().hex[:8]
        self.queue = f"gpu.hold-{run}"
        self.x, self.y, self.z = f"x-{run}", f"y-{run}", f"z-{run}"
        self.busy = f"busy-{uuid.uuid4().hex[:6]}"
        with database.session() as session:
            self.tenant = get_or_create_tenant(session, f"hold-{uuid.uuid4().hex[:8]}").id
            running = self.queued(session, self.x)
            residency.record(session, self.busy, [self.x])
        with database.session() as session:
            claim = transitions.claim_job(
                session,
                running,
                owner=self.busy,
                redelivered=False,
                max_attempts=5,
                lease_seconds=60,
            )
            assert claim.kind == transitions.ClaimKind.CLAIMED
        self.running = running

    def queued(self, session, model: str, age: float = 0.0) -> uuid.UUID:
        job = service.create_job(
            session,
            self.tenant,
            model=model,
            queue=self.queue,
            priority=Priority.NORMAL,
            request=job_request(model="tiny", steps=2),
            metadata=None,
        )
        job.published_at = utcnow() - timedelta(seconds=age)
        session.flush()
        return job.id

    def add(self, model: str, age: float = 0.0) -> uuid.UUID:
        with self.db.session() as session:
            return self.queued(session, model, age)

    def claim(
        self, worker: _Worker, message: uuid.UUID, redelivered: bool = False
    ) -> transitions.Claim:
        with self.db.session() as session:
            return claim_for_message(worker, session, message, redelivered=redelivered)

    def worker(self, owner: str, holds: str, bound: float = BOUND) -> _Worker:
        return _Worker(owner, tuple(getattr(self, name) for name in holds), bound)

    def held(self, worker: _Worker, job_id: uuid.UUID) -> bool:
        mine = [name for name, _ in worker.models.held()]
        with self.db.session() as session:
            condition = residency.held_by_others(session, worker.owner, mine, BOUND)
            return residency.is_held(session, condition, job_id)

    def set_running(self, **values) -> None:
        with self.db.session() as session:
            session.execute(update(Job).where(Job.id == self.running).values(**values))


def test_a_free_worker_leaves_a_cold_job_to_the_busy_worker_that_holds_its_model(database):
    pool = _Pool(database)
    cold = pool.add(pool.x)  # the fair choice (oldest), cold for the free worker
    warm = pool.add(pool.y)
    free = pool.worker("free", "y")
    claim = pool.claim(free, cold)  # the cold job's own message
    assert claim.kind == transitions.ClaimKind.CLAIMED
    assert (claim.job.id, claim.job.permit_id) == (warm, cold)  # the message as permit
    with database.session() as session:
        assert session.get(Job, cold).status == JobStatus.QUEUED  # left to the holder
    # With the hold off, the same choice takes the cold job at once.
    claim = pool.claim(pool.worker("off", "y", bound=0.0), cold)
    assert claim.job.id == cold and claim.job.lease_owner == "off"


def test_no_hold_for_an_idle_or_lost_holder_a_job_past_the_bound_or_a_warm_worker(database):
    pool = _Pool(database)
    free = pool.worker("free", "y")
    cold = pool.add(pool.x)
    assert pool.held(free, cold)
    assert not pool.held(pool.worker("warm", "xy"), cold)  # it holds the model too
    assert not pool.held(free, pool.add(pool.x, age=BOUND + 1))  # waited past the bound
    assert not pool.held(free, pool.add(pool.z))  # nobody holds z
    # A message may arrive before its publish is recorded: held from its creation.
    unrecorded = pool.add(pool.x)
    with database.session() as session:
        session.execute(update(Job).where(Job.id == unrecorded).values(published_at=None))
    assert pool.held(free, unrecorded)
    pool.set_running(lease_expires_at=utcnow() - timedelta(seconds=1))
    assert not pool.held(free, cold)  # the holder's lease lapsed: it may be dead
    pool.set_running(lease_expires_at=utcnow() + timedelta(seconds=60))
    assert pool.held(free, cold)
    pool.set_running(status=JobStatus.SUCCEEDED, lease_owner=None, lease_expires_at=None)
    assert not pool.held(free, cold)  # the holder is idle: its next message is its own
    with database.session() as session:
        residency.forget(session, pool.busy)
    with database.session() as session:
        assert session.scalars(select(HeldModel).where(HeldModel.owner == pool.busy)).all() == []
        # A worker killed a day ago left its rows: the next record removes them.
        gone = f"gone-{uuid.uuid4().hex[:6]}"
        old = utcnow() - timedelta(seconds=residency.GONE_SECONDS + 60)
        session.add(HeldModel(owner=gone, model=pool.x, loaded_at=old, seen_at=old))
    with database.session() as session:
        residency.record(session, pool.busy, [pool.x])
    with database.session() as session:
        assert session.get(HeldModel, (gone, pool.x)) is None


def test_a_message_whose_only_job_is_held_waits_until_the_bound_then_claims_it(database):
    pool = _Pool(database)
    left = 2.0  # the hold's seconds still to run when the claim starts
    cold = pool.add(pool.x, age=BOUND - left)
    before = WORKER_HOLD_SECONDS.labels(pool.queue)._value.get()
    started = time.monotonic()
    claim = pool.claim(pool.worker("free", "y"), cold)
    waited = time.monotonic() - started
    assert claim.job.id == cold and claim.job.lease_owner == "free"
    # It could not claim before the bound passed, however fast the machine.
    assert waited >= left - 0.2, waited
    held = WORKER_HOLD_SECONDS.labels(pool.queue)._value.get() - before
    assert held >= left - 0.5, held
    print(f"held {waited:.2f} s for a hold with {left} s to run; metric {held:.2f} s")


def test_a_held_message_goes_back_once_the_holder_is_idle_and_stayed_idle(database, monkeypatch):
    """The holder finishes while the free worker's message waits; the job is left
    SETTLE_SECONDS (the holder's own next message could start it), then its message goes
    back to the queue for the idle holder."""
    pool = _Pool(database)
    cold = pool.add(pool.x)
    waiting = threading.Event()
    wait = hold.Hold.wait

    def signalled(self, session, job):
        waiting.set()
        wait(self, session, job)

    monkeypatch.setattr(hold.Hold, "wait", signalled)
    result: dict = {}
    claimer = threading.Thread(
        target=lambda: result.update(claim=pool.claim(pool.worker("free", "y"), cold))
    )
    claimer.start()
    assert waiting.wait(30), "the claim never waited for the holder"
    with database.session() as session:
        assert session.get(Job, cold).status == JobStatus.QUEUED
    freed = time.monotonic()
    pool.set_running(status=JobStatus.SUCCEEDED, lease_owner=None, lease_expires_at=None)
    claimer.join(60)
    assert not claimer.is_alive(), "the claim still waits with its holder idle"
    assert result["claim"].kind == transitions.ClaimKind.ELSEWHERE
    assert time.monotonic() - freed >= hold.SETTLE_SECONDS - 0.1
    with database.session() as session:
        assert session.get(Job, cold).status == JobStatus.QUEUED  # nothing written


def test_one_message_waits_at_most_the_bound_in_all(database):
    """Held jobs that keep arriving never keep one delivery waiting past the bound."""
    pool = _Pool(database)
    waiting = hold.Hold(pool.worker("free", "y"))
    with database.session() as session:
        assert waiting.condition(session) is not None
        waiting.held_since = time.monotonic() - BOUND - 0.1
        assert waiting.condition(session) is None
        waiting.held_since = time.monotonic() - BOUND + 5
        assert waiting.condition(session) is not None


def test_a_message_goes_back_once_to_an_idle_holder_seen_lately(database):
    """An idle worker holds the chosen job's model: the message goes back to the queue
    (ELSEWHERE) for it, once; redelivered, or with the holder unseen for LIVE_SECONDS,
    or with the hold off, or to a worker that holds the model itself, it is claimed."""
    pool = _Pool(database)
    pool.set_running(status=JobStatus.SUCCEEDED, lease_owner=None, lease_expires_at=None)
    cold = pool.add(pool.x)
    free = pool.worker("free", "y")
    assert pool.claim(free, cold).kind == transitions.ClaimKind.ELSEWHERE
    again = pool.claim(free, cold, redelivered=True)  # it came back here: claimed
    assert again.kind == transitions.ClaimKind.CLAIMED and again.job.id == cold
    off = pool.claim(pool.worker("off", "y", bound=0.0), pool.add(pool.x))
    assert off.kind == transitions.ClaimKind.CLAIMED
    assert pool.claim(pool.worker("warm", "xy"), pool.add(pool.x)).job.lease_owner == "warm"
    with database.session() as session:  # the holder was last seen long ago: gone
        session.execute(
            update(HeldModel)
            .where(HeldModel.owner == pool.busy)
            .values(seen_at=utcnow() - timedelta(seconds=residency.LIVE_SECONDS + 1))
        )
    late = pool.claim(free, pool.add(pool.x))
    assert late.kind == transitions.ClaimKind.CLAIMED and late.job.lease_owner == "free"
    with database.session() as session:  # alive again: its renewal
        residency.seen(session, pool.busy)
    assert pool.claim(free, pool.add(pool.x)).kind == transitions.ClaimKind.ELSEWHERE


def test_also_held_names_the_models_a_live_worker_holds_too(database):
    """What a worker unloads first (workers/models.py): of its models, those another
    worker seen within LIVE_SECONDS holds too; its own rows and a silent worker's do not
    count."""
    run = uuid.uuid4().hex[:8]
    a, b, c = f"a-{run}", f"b-{run}", f"c-{run}"
    me, other, silent = (f"{who}-{run}" for who in ("me", "other", "silent"))
    with database.session() as session:
        residency.record(session, me, [a, b, c])
        residency.record(session, other, [b])
        residency.record(session, silent, [c])
        session.execute(
            update(HeldModel)
            .where(HeldModel.owner == silent)
            .values(seen_at=utcnow() - timedelta(seconds=residency.LIVE_SECONDS + 5))
        )
    with database.session() as session:
        assert residency.also_held(session, me, [a, b, c]) == {b}
        assert residency.also_held(session, other, [b]) == {b}  # mine holds it too
        assert residency.also_held(session, me, [a]) == set()
        for owner in (me, other, silent):
            residency.forget(session, owner)


def test_demand_counts_each_models_recent_running_and_queued_jobs(database):
    """What a worker's unloading weighs (workers/unload.py): per model, the jobs that
    succeeded within the window or run now, and those queued now; an older success, a
    failure and another model's jobs do not count, and a model with none is absent."""
    pool = _Pool(database)  # x: one job running
    window = 300.0
    for _ in range(2):
        pool.add(pool.y)
    finished = {
        (pool.z, JobStatus.SUCCEEDED, 10.0),  # counts
        (pool.z, JobStatus.SUCCEEDED, window + 60.0),  # before the window
        (pool.z, JobStatus.FAILED, 10.0),  # not a success
        (pool.y, JobStatus.SUCCEEDED, window - 30.0),  # counts
    }
    with database.session() as session:
        for model, status, age in finished:
            job_id = pool.queued(session, model)
            session.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(status=status, finished_at=utcnow() - timedelta(seconds=age))
            )
    other = f"w-{uuid.uuid4().hex[:8]}"  # no job at all
    with database.session() as session:
        counts = residency.demand(session, [pool.x, pool.y, pool.z, other], window)
        assert counts == {pool.x: (1, 0), pool.y: (1, 2), pool.z: (1, 0)}
        assert residency.demand(session, [], window) == {}
        residency.forget(session, pool.busy)
