"""A running job's progress reaches its event stream without a read of its row per
progress write, on PostgreSQL, whether the notification carries it or the API process
polls it (DIFFQ_PROGRESS_NOTIFY: docs/scale.md); what is sent is what a read would have
sent. With "wake" (the old form) each write costs the stream a read."""

from __future__ import annotations

import queue
import threading
import time
import uuid
from dataclasses import replace

import pytest

from app.jobs import service, transitions
from app.jobs.states import Priority
from app.keys import get_or_create_tenant
from app.web.resources.jobs import events as events_module
from app.web.watch import JobWatcher
from testbed.factories import job_request

pytestmark = pytest.mark.services

WRITES = 5


@pytest.fixture
def running_job(db):
    with db.session() as session:
        tenant = get_or_create_tenant(session, f"carried-{uuid.uuid4().hex[:8]}")
        job = service.create_job(
            session,
            tenant.id,
            model="tiny",
            queue="gpu.tiny",
            priority=Priority.NORMAL,
            request=job_request(model="tiny", prompt="p", steps=WRITES, seed=1),
            metadata=None,
        )
        tenant_id, job_id = tenant.id, job.id
    with db.session() as session:
        claim = transitions.claim_job(
            session, job_id, owner="w1", redelivered=False, max_attempts=3, lease_seconds=60
        )
        assert claim.kind == transitions.ClaimKind.CLAIMED
    return tenant_id, job_id


def _write(db, job_id, step: int, notify: str) -> None:
    with db.session() as session:
        written = transitions.record_progress(
            session,
            job_id,
            owner="w1",
            progress=transitions.progress_of("denoising", step, WRITES),
            lease_seconds=60,
            progress_notify=notify,
        )
    assert written.held


@pytest.mark.parametrize("notify", ["carried", "poll", "wake"])
def test_a_running_jobs_progress_is_streamed_without_reading_its_row(
    flask_app, db, running_job, monkeypatch, notify
):
    tenant_id, job_id = running_job
    svc = flask_app.extensions["diffq"]
    # No keep-alive inside the test: an idle timeout reads the row too.
    monkeypatch.setattr(svc, "settings", replace(svc.settings, sse_keepalive=120))
    if notify == "poll":  # the API process's watcher polls its streams' running jobs
        watcher = JobWatcher(svc.db, poll_progress=True)
        monkeypatch.setattr(svc, "watcher", watcher)
    reads = []
    real_get_job = service.get_job

    def counted_get_job(session, tenant, job):
        reads.append(job)
        return real_get_job(session, tenant, job)

    monkeypatch.setattr(events_module.service, "get_job", counted_get_job)
    got: queue.Queue = queue.Queue()

    def follow() -> None:
        with flask_app.test_request_context():
            for event in events_module.job_events(job_id, tenant_id, -1):
                got.put(event)
        got.put("closed")

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    first = got.get(timeout=30)
    assert first[0] == "status" and first[2]["status"] == "running"
    while got.queue and got.queue[0][0] == "progress":  # the claim's own progress
        got.get_nowait()
    reads_before = len(reads)
    for step in range(1, WRITES + 1):
        _write(db, job_id, step, notify)
    progress = []
    while not progress or progress[-1][2]["step"] < WRITES:
        event = got.get(timeout=30)
        assert event is not None and event[0] == "progress", event
        if not progress and event[2]["step"] == 0:
            continue  # the claim's own progress, its notification later than the drain
        progress.append(event)
    ids = [event[1] for event in progress]
    assert ids == sorted(set(ids)), ids  # versions, rising, none repeated
    steps = [event[2]["step"] for event in progress]
    # Rising to the last write; notifications that arrive while the stream writes are
    # sent as the newest of them (a client wants the latest progress, not every step).
    assert steps == sorted(set(steps)) and set(steps) <= set(range(1, WRITES + 1)), steps
    with db.session() as session:
        row = real_get_job(session, tenant_id, job_id)
        assert progress[-1] == ("progress", row.version, row.progress)  # as a read sends
    reads_during = len(reads) - reads_before
    print(f"{notify}: {WRITES} progress writes, {reads_during} row reads by the stream")
    if notify == "wake":
        assert reads_during >= 1
    else:
        assert reads_during == 0
    with db.session() as session:
        assert transitions.finish_succeeded(session, job_id, owner="w1", result={"images": []})
    while (event := got.get(timeout=30)) != "closed":
        last = event
    assert last[0] == "status" and last[2]["status"] == "succeeded"
    reader.join(timeout=10)
    if notify == "poll":
        watcher.close()


def test_a_keep_alive_comes_only_after_idle_seconds_not_before_carried_progress(
    flask_app, db, running_job, monkeypatch
):
    """After a keep-alive, a carried progress event comes next, not a second keep-alive:
    each keep-alive restarts the idle clock (a second one before the progress showed a
    clock left running)."""
    tenant_id, job_id = running_job
    svc = flask_app.extensions["diffq"]
    keepalive = 1.0
    monkeypatch.setattr(svc, "settings", replace(svc.settings, sse_keepalive=keepalive))
    got: queue.Queue = queue.Queue()

    def follow() -> None:
        with flask_app.test_request_context():
            for event in events_module.job_events(job_id, tenant_id, -1):
                got.put((time.monotonic(), event))
        got.put((time.monotonic(), "closed"))

    threading.Thread(target=follow, daemon=True).start()
    while True:  # the status, the claim's progress, then idle: the first keep-alive
        at, event = got.get(timeout=30)
        if event is None:
            break
    _write(db, job_id, 1, "carried")
    alive = 0
    while True:
        done, event = got.get(timeout=30)
        if event is None:
            alive += 1
            continue
        assert event[0] == "progress" and event[2]["step"] == 1, event
        break
    # Only as many keep-alives as whole idle periods passed since the first.
    assert alive <= int((done - at) / keepalive), (alive, done - at)
    with db.session() as session:
        assert transitions.finish_succeeded(session, job_id, owner="w1", result={"images": []})
    while got.get(timeout=30)[1] != "closed":
        pass
