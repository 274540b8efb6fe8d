"""The lifecycle's conditional updates, against PostgreSQL."""

from __future__ import annotations

import pytest

from app.jobs import service, transitions
from app.jobs.states import ErrorCode, JobStatus, Priority
from app.jobs.transitions import ClaimKind
from testbed.factories import job_request

pytestmark = pytest.mark.services


@pytest.fixture
def job_id(db):
    from app.keys import get_or_create_tenant

    with db.session() as session:
        tenant = get_or_create_tenant(session, f"states-{id(session)}")
        job = service.create_job(
            session,
            tenant.id,
            model="tiny",
            queue="gpu.tiny",
            priority=Priority.NORMAL,
            request=job_request(model="tiny", prompt="p", steps=4, seed=1),
            metadata=None,
        )
        return job.id


def claim(db, job_id, owner="w1", redelivered=False, max_attempts=3):
    with db.session() as session:
        return transitions.claim_job(
            session,
            job_id,
            owner=owner,
            redelivered=redelivered,
            max_attempts=max_attempts,
            lease_seconds=30,
        )


def test_a_queued_job_is_claimed_once(db, job_id):
    first = claim(db, job_id)
    assert first.kind == ClaimKind.CLAIMED
    assert first.job.status == JobStatus.RUNNING and first.job.attempts == 1
    assert first.job.lease_owner == "w1" and first.job.progress["stage"] == "loading"
    # A fresh duplicate of the message finds it running: someone holds it.
    assert claim(db, job_id, owner="w2").kind == ClaimKind.BUSY


def test_a_redelivered_message_takes_over_a_running_job(db, job_id):
    claim(db, job_id, owner="w1")
    second = claim(db, job_id, owner="w2", redelivered=True)
    assert second.kind == ClaimKind.CLAIMED and second.job.attempts == 2
    with db.session() as session:
        # The first owner's writes no longer land.
        assert not transitions.record_progress(
            session, job_id, owner="w1", progress={"stage": "denoising"}, lease_seconds=30
        )
        assert not transitions.finish_succeeded(session, job_id, owner="w1", result={"images": []})
        assert transitions.finish_succeeded(session, job_id, owner="w2", result={"images": []})


def test_a_succeeded_job_is_never_claimed_again_even_when_redelivered(db, job_id):
    claim(db, job_id)
    with db.session() as session:
        assert transitions.finish_succeeded(session, job_id, owner="w1", result={"images": []})
    for redelivered in (False, True):
        again = claim(db, job_id, owner="w9", redelivered=redelivered)
        assert again.kind == ClaimKind.FINISHED and again.job.attempts == 1


def test_the_attempt_cap_stops_claims(db, job_id):
    for attempt in range(3):
        assert claim(db, job_id, owner=f"w{attempt}", redelivered=True).kind == ClaimKind.CLAIMED
    assert claim(db, job_id, owner="w9", redelivered=True).kind == ClaimKind.EXHAUSTED


def test_failure_is_recorded_once_and_terminal_states_do_not_move(db, job_id):
    claim(db, job_id)
    with db.session() as session:
        assert transitions.finish_failed(
            session, job_id, code=ErrorCode.TIMEOUT, message="slow", owner="w1"
        )
        assert not transitions.finish_failed(session, job_id, code=ErrorCode.INTERNAL, message="x")
        assert not transitions.finish_succeeded(session, job_id, owner="w1", result={"images": []})
    with db.session() as session:
        from app.db.models.jobs import Job

        job = session.get(Job, job_id)
        assert (job.status, job.error_code, job.lease_owner) == (JobStatus.FAILED, "timeout", None)


def test_a_webhook_event_commits_with_its_change_or_not_at_all(db):
    """The webhook listener (app/webhooks/events.py) writes in the change's transaction."""
    from sqlalchemy import select

    from app.db.models.webhooks import WebhookEvent
    from app.keys import get_or_create_tenant
    from app.webhooks.events import record_change

    assert record_change in transitions.changes.listeners()
    with db.session() as session:
        tenant = get_or_create_tenant(session, f"states-hook-{id(session)}")
        job_id = service.create_job(
            session,
            tenant.id,
            model="tiny",
            queue="gpu.tiny",
            priority=Priority.NORMAL,
            request=job_request(model="tiny", prompt="p", steps=4, seed=1),
            metadata=None,
            webhook_url="https://hooks.example.com/in",
            webhook_events=["job.running", "job.failed"],
        ).id

    def events() -> list[str]:
        with db.session() as session:
            return list(
                session.scalars(select(WebhookEvent.type).where(WebhookEvent.job_id == job_id))
            )

    with pytest.raises(RuntimeError), db.session() as session:
        claimed = transitions.claim_job(
            session, job_id, owner="w1", redelivered=False, max_attempts=3, lease_seconds=30
        )
        assert claimed.kind == ClaimKind.CLAIMED
        raise RuntimeError("the transaction rolls back")
    assert events() == []  # none invented for a change that did not happen
    assert claim(db, job_id).kind == ClaimKind.CLAIMED
    assert events() == ["job.running"]
    with db.session() as session:
        transitions.finish_failed(session, job_id, code=ErrorCode.INTERNAL, message="x", owner="w1")
    assert sorted(events()) == ["job.failed", "job.running"]


@pytest.mark.parametrize("skew_hours", [-1, 1])
def test_leases_follow_the_database_clock_not_the_workers(db, job_id, monkeypatch, skew_hours):
    """A worker whose wall clock is an hour off writes its lease on PostgreSQL's clock:
    the reaper neither takes a live run (clock behind) nor waits an hour (clock ahead);
    and the job's started and finished times are the database's, not an hour off."""
    from datetime import timedelta

    from sqlalchemy import text

    from app.db import types
    from app.db.models.jobs import Job

    skewed = lambda: types.datetime.now(types.UTC) + timedelta(hours=skew_hours)  # noqa: E731
    monkeypatch.setattr(transitions, "utcnow", skewed)
    monkeypatch.setattr(service, "utcnow", skewed)
    claim(db, job_id, owner="w1")
    with db.session() as session:
        assert transitions.record_progress(
            session, job_id, owner="w1", progress={"stage": "denoising"}, lease_seconds=30
        )
        assert transitions.renew_lease(session, job_id, owner="w1", lease_seconds=30)
    with db.session() as session:
        db_now = session.scalar(text("SELECT statement_timestamp()"))
        job = session.get(Job, job_id)
        assert abs((job.lease_expires_at - db_now).total_seconds() - 30) < 5
        # Not expired on the database's clock, whatever the worker's said.
        assert job_id not in {j.id for j in service.lease_expired_jobs(session)}
    with db.session() as session:
        transitions.finish_failed(session, job_id, code=ErrorCode.INTERNAL, message="x", owner="w1")
    with db.session() as session:
        db_now = session.scalar(text("SELECT statement_timestamp()"))
        job = session.get(Job, job_id)
        # The job's own times too: a client sees them beside its created_at, and a run's
        # length is finished_at - started_at, whichever worker wrote each.
        for stamp in (job.started_at, job.finished_at, job.updated_at):
            assert abs((db_now - stamp).total_seconds()) < 5, (stamp, db_now)
        assert job.created_at <= job.started_at <= job.finished_at


def test_a_row_locked_by_a_frozen_worker_does_not_stall_the_reaper(db, job_id):
    """A worker frozen between a job's UPDATE and its COMMIT holds the row. The reaper
    passes over it within about a second (it used to wait for its statement timeout,
    15 s, on every pass, stalling the relay), reaps every other lost job, and takes the
    locked one at the first pass after the lock is gone."""
    import time

    from sqlalchemy import text, update

    from app.db.models.jobs import Job
    from app.housekeeping.leases import reap_lost_jobs
    from app.keys import get_or_create_tenant

    with db.session() as session:
        tenant = get_or_create_tenant(session, f"reap-{job_id}")
        other = service.create_job(
            session,
            tenant.id,
            model="tiny",
            queue="gpu.tiny",
            priority=Priority.NORMAL,
            request=job_request(model="tiny", prompt="q", steps=4, seed=2),
            metadata=None,
        ).id
    for jid, owner in ((job_id, "frozen"), (other, "gone")):
        assert claim(db, jid, owner=owner).kind == ClaimKind.CLAIMED
    with db.session() as session:
        expire = text("statement_timestamp() - interval '1 second'")
        session.execute(
            update(Job).where(Job.id.in_([job_id, other])).values(lease_expires_at=expire)
        )
    frozen = db.sessions()
    frozen.execute(update(Job).where(Job.id == job_id).values(progress={"stage": "denoising"}))
    try:
        started = time.monotonic()
        reap_lost_jobs(db, max_attempts=3)  # (other tests' lost jobs, if any, too)
        took = time.monotonic() - started
        with db.session() as session:
            assert session.get(Job, other).status == JobStatus.QUEUED
            assert session.get(Job, job_id).status == JobStatus.RUNNING
        print(f"\nreaper pass with one locked row: {took:.2f} s")
        assert took < 5, took
    finally:
        frozen.rollback()
        frozen.close()
    assert reap_lost_jobs(db, max_attempts=3) >= 1
    with db.session() as session:
        assert session.get(Job, job_id).status == JobStatus.QUEUED


def test_a_lease_that_ran_out_while_the_database_restarted_is_not_reaped_at_once(db, job_id):
    """A lease that expired within `restart_grace` of the database's start says nothing
    of its worker (it could not renew while the database was down): the reaper leaves it
    for that long, then reaps it. Here the database has been up for less than a century
    and for more than nothing."""
    from sqlalchemy import text, update

    from app.db.models.jobs import Job

    assert claim(db, job_id, owner="restarted").kind == ClaimKind.CLAIMED
    session = db.sessions()  # the lease's expiry never committed: no relay reaps it meanwhile
    try:
        expire = text("statement_timestamp() - interval '1 second'")
        session.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=expire))
        century = [
            j.id for j in service.lease_expired_jobs(session, limit=9999, restart_grace=3.2e9)
        ]
        expired = [
            j.id for j in service.lease_expired_jobs(session, limit=9999, restart_grace=1e-3)
        ]
    finally:
        session.rollback()
        session.close()
    assert job_id not in century
    assert job_id in expired


def test_a_hard_time_limit_fails_the_job_only_while_the_run_it_stopped_holds_it(
    db, job_id, monkeypatch
):
    """A hung run's lease lapsed and another pool child took the job over; when the hung
    child's hard time limit comes, the job it no longer holds runs on (tasks/boot/gpu.py)."""
    import socket
    from types import SimpleNamespace

    from celery.exceptions import TimeLimitExceeded

    from app.broker.payload import build_payload
    from app.db.models.jobs import Job
    from tasks.boot import gpu

    monkeypatch.setattr(gpu, "services", lambda: SimpleNamespace(db=db))
    host = socket.gethostname()
    claim(db, job_id, owner=f"{host}:4242:0a0a0a0a")  # the run now: another child's
    with db.session() as session:
        payload = build_payload(session.get(Job, job_id))

    def state():
        with db.session() as session:
            job = session.get(Job, job_id)
            return job.status, job.error_code

    gpu.record_hard_timeout(payload, TimeLimitExceeded(330), pid=4141)  # the hung child
    assert state() == (JobStatus.RUNNING, None)
    gpu.record_hard_timeout(payload, TimeLimitExceeded(330), pid=4242)  # the run it held
    assert state() == (JobStatus.FAILED, "timeout")
