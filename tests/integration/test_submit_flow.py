"""submit_job against PostgreSQL: the outbox guarantee with a publish that fails or
succeeds, and the queued cap exact under a burst of concurrent submits of one tenant."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, inspect, select, text

from app.catalog import tiny_spec
from app.db.models.jobs import Job
from app.db.models.tenants import Tenant
from app.db.types import utcnow
from app.jobs import service
from app.jobs.states import JobStatus
from app.jobs.submit import Caps, Refused, Submission, submit_job
from testbed.factories import job_request
from testbed.waiting import wait_until

pytestmark = pytest.mark.services

SPEC = tiny_spec(Path("/nonexistent"), name="tiny", queue=f"gpu.flow-{uuid.uuid4().hex[:8]}")
NO_CAPS = Caps(max_queued=0, max_running=0, daily_gpu_seconds=None)


class FakePublisher:
    def __init__(self, confirms: bool) -> None:
        self.confirms = confirms
        self.published: list[uuid.UUID] = []

    def publish(self, job, spec=None) -> bool:
        self.published.append(job.id)
        return self.confirms


def _request(prompt: str = "flow") -> Submission:
    request = job_request(SPEC, prompt=prompt, steps=2, seed=1)
    return Submission(spec=SPEC, request=request)


def _tenant(db) -> uuid.UUID:
    with db.session() as session:
        tenant = Tenant(name=f"flow-{uuid.uuid4().hex[:10]}")
        session.add(tenant)
        session.flush()
        return tenant.id


def _row(db, job_id) -> Job:
    with db.session() as session:
        return session.get(Job, job_id)


def test_a_failed_publish_leaves_the_job_to_the_relay_and_a_confirm_is_recorded(db):
    tenant_id = _tenant(db)
    with db.sessions() as session:
        lost = submit_job(session, FakePublisher(False), tenant_id, _request(), NO_CAPS).job
    publisher = FakePublisher(True)
    with db.sessions() as session:
        sent = submit_job(session, publisher, tenant_id, _request(), NO_CAPS).job
    assert publisher.published == [sent.id]
    # The confirm is recorded by the process's batch, a few milliseconds later.
    wait_until(lambda: _row(db, sent.id).published_at is not None, timeout=5)
    assert _row(db, lost.id).status == JobStatus.QUEUED
    assert _row(db, lost.id).published_at is None
    with db.session() as session:
        backlog = service.unpublished_job_ids(session, utcnow(), limit=10_000)
    assert lost.id in backlog and sent.id not in backlog


def test_the_queued_cap_is_exact_under_a_burst_of_one_tenant(db):
    tenant_id, cap, burst = _tenant(db), 7, 40
    caps = Caps(max_queued=cap, max_running=0, daily_gpu_seconds=None)

    def one(i: int) -> bool:
        with db.sessions() as session:
            try:
                submit_job(session, FakePublisher(True), tenant_id, _request(f"b{i}"), caps)
            except Refused as refused:
                assert refused.status == 429 and refused.retry_after
                return False
            return True

    with ThreadPoolExecutor(max_workers=16) as pool:
        accepted = sum(pool.map(one, range(burst)))
    with db.session() as session:
        queued = session.scalar(
            select(func.count())
            .select_from(Job)
            .where(Job.tenant_id == tenant_id, Job.status == JobStatus.QUEUED)
        )
    print(f"\nburst of {burst} submits on 16 threads, cap {cap}: {accepted} accepted")
    assert accepted == cap and queued == cap


def test_over_the_in_flight_cap_a_job_is_held_not_published(db):
    tenant_id = _tenant(db)
    caps = Caps(max_queued=0, max_running=1, daily_gpu_seconds=None)
    publisher = FakePublisher(True)
    with db.sessions() as session:
        first = submit_job(session, publisher, tenant_id, _request(), caps).job
    with db.sessions() as session:
        held = submit_job(session, publisher, tenant_id, _request(), caps).job
    assert publisher.published == [first.id]
    assert held.admitted_at is None and _row(db, held.id).admitted_at is None


def test_a_tenant_over_its_daily_quota_is_refused(db):
    tenant_id = _tenant(db)
    from app import usage

    with db.session() as session:
        usage.record(session, tenant_id, "tiny", usage.Charge(5.0, "cpu", 1), utcnow().date())
    caps = Caps(max_queued=0, max_running=0, daily_gpu_seconds=5.0)
    with db.sessions() as session, pytest.raises(Refused) as refused:
        submit_job(session, FakePublisher(True), tenant_id, _request(), caps)
    assert refused.value.status == 429 and refused.value.retry_after > 0


@pytest.mark.parametrize(
    "caps", [NO_CAPS, Caps(max_queued=50, max_running=0, daily_gpu_seconds=None)]
)
def test_the_submitted_job_is_the_row_as_stored(db, caps):
    """The job a submit answers with is built from the values it inserted, not read back:
    every attribute must be what the row holds."""
    tenant_id = _tenant(db)
    request = Submission(
        spec=SPEC,
        request=replace(_request().request, width=64),
        metadata={"order": 7},
        cancel_after=600,
        webhook="https://hooks.example.com/in",
        webhook_events=["completed"],
        idempotency_key=f"k-{uuid.uuid4().hex}",
        body_hash="ab" * 32,
    )
    with db.sessions() as session:
        answered = submit_job(session, FakePublisher(True), tenant_id, request, caps).job
    stored = _row(db, answered.id)
    for attr in (a.key for a in inspect(Job).column_attrs):
        if attr == "published_at":  # recorded after the answer, by the confirm's batch
            continue
        assert getattr(answered, attr) == getattr(stored, attr), attr


@pytest.mark.parametrize("committed", [False, True])
def test_a_connection_lost_on_the_jobs_statement_stores_it_once(db, monkeypatch, committed):
    """The server ends the connection as the job's statement goes out: before it ran
    (`committed` False) or after it committed, its answer lost. Either way the submit
    stores the job once and answers with it, instead of a 503 for a job that may exist."""
    from app.db import session as sessions
    from app.jobs import submit as submit_module

    real = sessions.execute_alone
    cut = []

    def terminate(session) -> None:
        pid = real(session, "SELECT pg_backend_pid()", {})[0][0]
        with db.session() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        wait_until(lambda: _backend_gone(db, pid), timeout=5)

    def cutting(session, sql, params, **kwargs):
        if "INSERT INTO jobs" not in sql or cut:
            return real(session, sql, params, **kwargs)
        cut.append(sql)
        if committed:
            real(session, sql, params)
            terminate(session)
            return real(session, "SELECT 1", {})  # raises: the connection is gone
        terminate(session)
        return real(session, sql, params, **kwargs)  # raises before it ran

    monkeypatch.setattr(submit_module, "execute_alone", cutting)
    tenant_id = _tenant(db)
    caps = Caps(max_queued=50, max_running=0, daily_gpu_seconds=None)
    with db.sessions() as session:
        job = submit_job(session, FakePublisher(True), tenant_id, _request(), caps).job
    assert cut, "the job's statement was not cut"
    with db.session() as session:
        stored = session.scalar(select(func.count()).where(Job.tenant_id == tenant_id))
    print(f"\ncommitted before the cut: {committed}; jobs stored: {stored}")
    assert stored == 1 and _row(db, job.id) is not None
    assert not _reservation_of(db, job.id)  # its slot was released with the job's insert


def _backend_gone(db, pid: int) -> bool:
    with db.session() as session:
        row = session.execute(text("SELECT 1 FROM pg_stat_activity WHERE pid = :p"), {"p": pid})
        return row.first() is None


def _reservation_of(db, job_id) -> bool:
    with db.session() as session:
        found = session.execute(
            text("SELECT 1 FROM submit_reservations WHERE job_id = :j"), {"j": job_id}
        )
        return found.first() is not None


def test_stranded_jobs_are_found_on_the_databases_clock_not_the_askers(db, monkeypatch):
    """A worker whose clock runs 5 minutes ahead (tests/faults/test_clock_jump.py) must not
    find a job published a moment ago 'published 60 s ago': the publish is recorded and
    compared on PostgreSQL's clock (workers/stranded.py)."""
    tenant_id = _tenant(db)
    with db.sessions() as session:
        job = submit_job(session, FakePublisher(True), tenant_id, _request(), NO_CAPS).job
    wait_until(lambda: _row(db, job.id).published_at is not None, timeout=5)
    ahead = utcnow() + timedelta(minutes=5)
    monkeypatch.setattr("app.db.types.utcnow", lambda: ahead)
    monkeypatch.setattr("app.jobs.service.utcnow", lambda: ahead)

    def stranded(seconds: float) -> list[uuid.UUID]:
        with db.session() as session:
            return service.stranded_job_ids(session, [SPEC.queue], seconds)

    assert job.id not in stranded(60)
    wait_until(lambda: job.id in stranded(0.2), timeout=5)  # and found once that old
