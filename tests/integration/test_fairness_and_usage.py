"""Fair share's choice and queue positions, daily usage and the GPU-second quota, against
PostgreSQL (each test has its own queue name, so other tests' jobs never count)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import update

from app import usage
from app.db.models.jobs import Job
from app.db.models.tenants import Tenant
from app.db.types import utcnow
from app.jobs import fairness, service, transitions
from app.jobs.states import JobStatus, Priority
from testbed.factories import job_request

pytestmark = pytest.mark.services

WINDOW = 600.0


def _tenant(session, prefix: str, weight: float = 1.0) -> Tenant:
    tenant = Tenant(name=f"{prefix}-{uuid.uuid4().hex[:10]}", weight=weight)
    session.add(tenant)
    session.flush()
    return tenant


def _queued(session, tenant, queue: str, n: int, priority=Priority.NORMAL) -> list[Job]:
    jobs = []
    for i in range(n):
        job = service.create_job(
            session,
            tenant.id,
            model="tiny",
            queue=queue,
            priority=priority,
            request=job_request(model="tiny", prompt=f"p{i}", steps=2, seed=i),
            metadata=None,
        )
        job.published_at = utcnow()
        jobs.append(job)
    session.flush()
    return jobs


def _used(session, tenant, queue: str, seconds: float) -> None:
    """A finished job of `seconds` GPU time in the window."""
    job = _queued(session, tenant, queue, 1)[0]
    session.execute(
        update(Job)
        .where(Job.id == job.id)
        .values(status=JobStatus.SUCCEEDED, finished_at=utcnow(), gpu_seconds=seconds)
    )


def test_a_message_starts_the_job_of_the_tenant_with_less_recent_gpu_time(db):
    queue = f"gpu.fair-{uuid.uuid4().hex[:8]}"
    with db.session() as session:
        heavy, light = _tenant(session, "heavy"), _tenant(session, "light")
        _used(session, heavy, queue, 30.0)
        heavy_jobs = _queued(session, heavy, queue, 5)
        light_jobs = _queued(session, light, queue, 2)
        now = utcnow()
        # The heavy tenant's message starts the light tenant's oldest job ...
        assert fairness.choose(session, heavy_jobs[0], now, WINDOW) == light_jobs[0].id
        # ... and the light tenant's own messages start its jobs in order.
        assert fairness.choose(session, light_jobs[1], now, WINDOW) == light_jobs[0].id
        # Positions follow the turns: the light tenant's first job is next.
        assert fairness.position(session, light_jobs[0], now, WINDOW)[0] == 0
        assert fairness.position(session, heavy_jobs[0], now, WINDOW)[0] == 1
        assert fairness.position(session, heavy_jobs[4], now, WINDOW)[0] == 4 + 2


def test_weights_scale_the_share_and_ties_keep_the_message_own_job(db):
    queue = f"gpu.fair-{uuid.uuid4().hex[:8]}"
    with db.session() as session:
        double, single = _tenant(session, "double", weight=2.0), _tenant(session, "single")
        # 30 s at weight 2 weighs 15: less than 20 s at weight 1.
        _used(session, double, queue, 30.0)
        _used(session, single, queue, 20.0)
        doubles = _queued(session, double, queue, 2)
        singles = _queued(session, single, queue, 2)
        now = utcnow()
        assert fairness.choose(session, singles[0], now, WINDOW) == doubles[0].id
        # Equal weighted use: the message's own tenant goes (no needless swap).
        _used(session, double, queue, 10.0)  # 40 s at weight 2 weighs 20, as 20 s at 1
        assert fairness.choose(session, singles[0], now, WINDOW) == singles[0].id
        assert fairness.choose(session, doubles[1], now, WINDOW) == doubles[0].id


def test_priority_still_comes_first_and_old_use_leaves_the_window(db):
    queue = f"gpu.fair-{uuid.uuid4().hex[:8]}"
    with db.session() as session:
        heavy, light = _tenant(session, "heavy"), _tenant(session, "light")
        _used(session, heavy, queue, 30.0)
        high = _queued(session, heavy, queue, 1, priority=Priority.HIGH)[0]
        light_job = _queued(session, light, queue, 1)[0]
        now = utcnow()
        # A different priority is not a candidate: the high job keeps its message.
        assert fairness.choose(session, high, now, WINDOW) == high.id
        assert fairness.position(session, light_job, now, WINDOW)[0] == 1  # the high one
        heavy_normal = _queued(session, heavy, queue, 1)[0]
        assert fairness.choose(session, heavy_normal, now, WINDOW) == light_job.id
        # An hour later the heavy tenant's use has left a 10-minute window.
        later = now + timedelta(hours=1)
        assert fairness.choose(session, heavy_normal, later, WINDOW) == heavy_normal.id


def test_a_redelivered_message_finds_the_run_it_started(db):
    queue = f"gpu.fair-{uuid.uuid4().hex[:8]}"
    with db.session() as session:
        tenant = _tenant(session, "permit")
        message_job, other = _queued(session, tenant, queue, 2)
    with db.session() as session:
        claim = transitions.claim_job(
            session,
            other.id,
            owner="w1",
            redelivered=False,
            max_attempts=3,
            lease_seconds=30,
            permit_id=message_job.id,
        )
        assert claim.kind == transitions.ClaimKind.CLAIMED
    with db.session() as session:
        assert transitions.run_started_by(session, message_job.id) == other.id
        assert transitions.run_started_by(session, other.id) is None


def test_usage_adds_up_per_day_model_and_device_and_the_quota_frees_at_midnight(db):
    with db.session() as session:
        tenant = _tenant(session, "usage")
        tenant.daily_gpu_seconds = 10.0
        today = utcnow().date()
        usage.record(session, tenant.id, "tiny", usage.Charge(4.0, "cpu", 1), today)
        usage.record(session, tenant.id, "tiny", usage.Charge(5.5, "cpu", 2), today)
        usage.record(
            session, tenant.id, "tiny", usage.Charge(100.0, "cpu", 1), today - timedelta(1)
        )
        rows = usage.between(session, tenant.id, today, today)
        assert [(r.gpu_seconds, r.jobs, r.images) for r in rows] == [(9.5, 2, 3)]
        now = utcnow()
        assert usage.check_daily_quota(session, tenant.id, now).allowed
        usage.record(session, tenant.id, "tiny", usage.Charge(0.5, "cpu", 1), today)
        verdict = usage.check_daily_quota(session, tenant.id, now)
        assert not verdict.allowed and verdict.used == pytest.approx(10.0)
        seconds_to_midnight = (24 * 3600) - (now.hour * 3600 + now.minute * 60 + now.second)
        assert abs(verdict.retry_after - seconds_to_midnight) <= 2
    assert usage.price({"cpu": 0.5}, "cpu", 3.0) == 1.5
    assert usage.price({"*": 2.0}, "NVIDIA H200", 3.0) == 6.0
    assert usage.price({"cpu": 0.5}, "NVIDIA H200", 3.0) is None


def test_operators_set_weight_and_quota_from_the_cli(stack, db):
    import subprocess
    import sys

    name = f"cli-{uuid.uuid4().hex[:8]}"

    def diffq(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "cli", *args],
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    created = diffq("keys", "create", "--tenant", name, "--weight", "3")
    assert created.returncode == 0, created.stderr
    changed = diffq("tenants", "set", name, "--daily-gpu-seconds", "3600")
    assert changed.returncode == 0, changed.stderr
    assert "weight 3" in changed.stdout and "quota 3600" in changed.stdout
    with db.session() as session:
        from sqlalchemy import select

        tenant = session.scalar(select(Tenant).where(Tenant.name == name))
        assert (tenant.weight, tenant.daily_gpu_seconds) == (3.0, 3600.0)
    assert diffq("tenants", "set", name, "--no-quota").returncode == 0
    refused = diffq("tenants", "set", name, "--weight", "0")
    assert refused.returncode != 0 and "positive" in refused.stderr
    with db.session() as session:
        tenant = session.scalar(select(Tenant).where(Tenant.name == name))
        assert (tenant.weight, tenant.daily_gpu_seconds) == (3.0, None)


def _worker(owner: str):
    """What the claim reads of a worker runtime."""
    from types import SimpleNamespace

    settings = SimpleNamespace(
        max_attempts=5,
        lease_seconds=30,
        fair_share=True,
        fair_share_window=WINDOW,
        warm_hold_seconds=0.0,
    )
    return SimpleNamespace(owner=owner, settings=settings, warmth=lambda: None)


def _reaped(db, job_id) -> None:
    """The job's run lost: its lease lapses and the reaper hands it back to the queue."""
    with db.session() as session:
        transitions.claim_job(
            session, job_id, owner="dead", redelivered=False, max_attempts=5, lease_seconds=30
        )
    with db.session() as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(lease_expires_at=utcnow() - timedelta(seconds=5))
        )
    with db.session() as session:
        outcome = transitions.reap(session, session.get(Job, job_id), max_attempts=5)
        assert outcome == transitions.ReapOutcome.REQUEUED
    with db.session() as session:  # the relay publishes it again
        session.execute(update(Job).where(Job.id == job_id).values(published_at=utcnow()))


def test_a_stale_redelivery_takes_over_no_run_that_a_later_message_started(db):
    """The reaper handed job V back; V's next message started K (fair share); then V's
    first message comes back redelivered (its consumer, frozen past the lease, died). It
    must not take K over, a live run: it is only a permit now. The later message,
    redelivered, still takes over the run it started."""
    from workers.claim import claim_for_message

    queue = f"gpu.fair-{uuid.uuid4().hex[:8]}"
    with db.session() as session:
        heavy, light = _tenant(session, "heavy"), _tenant(session, "light")
        _used(session, heavy, queue, 30.0)
        [victim] = _queued(session, heavy, queue, 1)
        [other] = _queued(session, light, queue, 1)
    _reaped(db, victim.id)
    with db.session() as session:
        assert session.get(Job, victim.id).requeues == 1
        # The relay's new message (published with the count 1) starts the fairer job.
        claim = claim_for_message(_worker("w2"), session, victim.id, redelivered=False, requeues=1)
        assert claim.job.id == other.id and claim.job.permit_id == victim.id
    with db.session() as session:  # the first message (count 0), redelivered
        stale = claim_for_message(_worker("w3"), session, victim.id, redelivered=True, requeues=0)
        assert stale.kind == transitions.ClaimKind.CLAIMED and stale.job.id == victim.id
    with db.session() as session:
        running = session.get(Job, other.id)
        assert (running.lease_owner, running.attempts) == ("w2", 1)  # untouched
        # w2 dies: the message that started its run comes back and takes it over.
        current = claim_for_message(_worker("w4"), session, victim.id, redelivered=True, requeues=1)
        assert current.job.id == other.id
        assert (current.job.lease_owner, current.job.attempts) == ("w4", 2)


def test_a_stale_redelivery_leaves_the_jobs_own_later_run_alone(db):
    from workers.claim import claim_for_message

    queue = f"gpu.fair-{uuid.uuid4().hex[:8]}"
    with db.session() as session:
        [job] = _queued(session, _tenant(session, "own"), queue, 1)
    _reaped(db, job.id)
    with db.session() as session:
        claim = claim_for_message(_worker("w2"), session, job.id, redelivered=False, requeues=1)
        assert claim.job.id == job.id and claim.job.attempts == 2
    with db.session() as session:
        stale = claim_for_message(_worker("w3"), session, job.id, redelivered=True, requeues=0)
        assert stale.kind == transitions.ClaimKind.BUSY
        assert session.get(Job, job.id).lease_owner == "w2"
        # A message from before the count (no "requeues") is read as it always was.
        older = claim_for_message(_worker("w4"), session, job.id, redelivered=True)
        assert older.kind == transitions.ClaimKind.CLAIMED and older.job.lease_owner == "w4"


def test_a_claim_passes_over_a_job_another_claim_holds(db):
    """The workers of a queue all choose the same fairest job. While one worker's claim of
    it is uncommitted, another worker's message starts the next job instead of waiting on
    the row lock (a wait would end in this session's lock_timeout, an error), and the held
    job is left to its holder. With nothing held, the same message chooses the held job."""
    from sqlalchemy import select, text

    from workers.claim import claim_for_message

    queue = f"gpu.fair-{uuid.uuid4().hex[:8]}"
    with db.session() as session:
        light, heavy = _tenant(session, "light"), _tenant(session, "heavy")
        _used(session, heavy, queue, 30.0)
        [fairest] = _queued(session, light, queue, 1)
        [own] = _queued(session, heavy, queue, 1)
    with db.session() as holder:  # another worker's claim, not yet committed
        holder.execute(select(Job.id).where(Job.id == fairest.id).with_for_update())
        with db.session() as session:
            session.execute(text("SET LOCAL lock_timeout = '5s'"))
            claim = claim_for_message(_worker("w2"), session, own.id, redelivered=False)
            assert claim.kind == transitions.ClaimKind.CLAIMED
            assert claim.job.id == own.id  # the next fairest: the message's own job
    with db.session() as session:
        assert session.get(Job, fairest.id).status == JobStatus.QUEUED  # left to its holder
        [other] = _queued(session, heavy, queue, 1)
    with db.session() as session:  # nothing held: the fair choice as ever
        claim = claim_for_message(_worker("w3"), session, other.id, redelivered=False)
        assert claim.job.id == fairest.id and claim.job.permit_id == other.id
