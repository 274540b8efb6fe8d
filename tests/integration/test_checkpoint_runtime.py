"""Checkpoints on a worker runtime in this process, on PostgreSQL and S3 (production's
stores) and on SQLite and local files (`diffq up`'s).

A job handed back at a shutdown stores its state and goes back to the queue; the next run
resumes at that step (the denoiser runs only the steps left, plus one), its manifest says
so, its images are the uninterrupted run's bytes, and its checkpoint is gone. Every bad
checkpoint (missing, truncated, another model's, another version's, a layout it does not
know) starts the job afresh with the reason in its manifest, never losing it. A
checkpoint left by a job that ended elsewhere is removed by the relay's retention. A job
whose model is paused `now` goes back the same way and resumes once it is resumed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from app.broker.payload import build_payload
from app.db.models.jobs import Job
from app.housekeeping.retention import remove_left_checkpoints
from app.jobs.service import create_job
from app.jobs.states import JobStatus, Priority
from app.keys import get_or_create_tenant
from app.kinds import request_from_stored
from app.storage import StorageError, checkpoint_key
from testbed.waiting import wait_until
from workers import denoise_state, execute

pytestmark = pytest.mark.services

STEPS = 12


@pytest.fixture(scope="module", params=["production", "embedded"])
def runtime(request, stack, tmp_path_factory):
    import os

    from app.config import load_settings
    from app.db.migrate import upgrade
    from app.services import Services
    from workers.runtime import build_runtime

    env = dict(os.environ)
    if request.param == "embedded":  # diffq up's stores: SQLite, local files
        home = tmp_path_factory.mktemp("embedded-checkpoints")
        env = {k: v for k, v in env.items() if not k.startswith(("DIFFQ_", "AWS_"))}
        env.update(DIFFQ_HOME=str(home), DIFFQ_MODELS_FILE=os.environ["DIFFQ_MODELS_FILE"])
    settings = load_settings(env)
    if request.param == "embedded":
        assert settings.database_url.startswith("sqlite") and settings.storage_url.startswith(
            "file://"
        )
        upgrade(settings.database_url)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # A drain sends back any job, however near its end.
    rt = build_runtime(Services(replace(settings, shutdown_finish=0.0)), ["gpu.tiny"])
    yield rt
    rt.close()
    torch.set_num_threads(threads)


@pytest.fixture
def db(runtime):
    return runtime.db


def _new_job(db, seed: int):
    request = {
        "prompt": "a lighthouse at dusk",
        "negative_prompt": None,
        "model": "tiny",
        "width": 64,
        "height": 64,
        "steps": STEPS,
        "guidance_scale": 7.5,
        "seed": seed,
        "num_images": 1,
        "scheduler": "euler_a",  # ancestral: the RNG's state matters
        "output_format": "png",
        "priority": "normal",
    }
    with db.session() as session:
        tenant = get_or_create_tenant(session, "checkpoint-tests")
        job = create_job(
            session,
            tenant.id,
            model="tiny",
            queue="gpu.tiny",
            priority=Priority.NORMAL,
            request=request_from_stored(request),
            metadata=None,
        )
        return job.id, build_payload(job)


def _row(db, job_id) -> Job:
    with db.session() as session:
        job = session.get(Job, job_id)
        session.expunge(job)
        return job


def _finish(runtime, payload, *, redelivered=False):
    outcome = execute.execute_job(runtime, payload, redelivered=redelivered)
    if runtime.postprocessor is not None:
        assert runtime.postprocessor.drain(timeout=60)
    return outcome


def _image(runtime, job: Job) -> bytes:
    return runtime.storage.get(job.result["images"][0]["key"])


class DenoiserCalls:
    """Counts the UNet's calls; calls `at_call(n)` before the n-th."""

    def __init__(self, monkeypatch, unet, at_call=None):
        self.count = 0
        forward = unet.forward

        def counted(*args, **kwargs):
            self.count += 1
            if at_call is not None:
                at_call(self.count)
            return forward(*args, **kwargs)

        monkeypatch.setattr(unet, "forward", counted)


@pytest.fixture
def reference(runtime, db):
    """An uninterrupted run of the job the tests interrupt: its image's bytes."""

    def run(seed: int) -> bytes:
        job_id, payload = _new_job(db, seed)
        _finish(runtime, payload)
        job = _row(db, job_id)
        assert job.status == JobStatus.SUCCEEDED
        assert "resumes" not in job.manifest
        return _image(runtime, job)

    return run


def _drained(runtime):
    runtime.draining.clear()
    runtime.hand_back_requested.clear()


def test_a_job_handed_back_at_a_shutdown_resumes_where_it_stopped(
    runtime, db, monkeypatch, reference
):
    expected = reference(seed=21)
    unet = runtime.models["tiny"].pipeline.unet
    job_id, payload = _new_job(db, seed=21)
    calls = DenoiserCalls(monkeypatch, unet, at_call=lambda n: n == 5 and runtime.request_drain())
    try:
        outcome = _finish(runtime, payload)
    finally:
        _drained(runtime)
    handed = _row(db, job_id)
    print(f"handed back: {outcome.verdict} ({outcome.reason}); checkpoint {handed.checkpoint_step}")
    assert outcome.verdict == execute.Verdict.REQUEUE
    assert handed.status == JobStatus.QUEUED and handed.checkpoint_step == 5
    key = checkpoint_key(handed.tenant_id, job_id)
    state = denoise_state.loads(runtime.storage.get(key))
    assert (state.step, state.total, state.meta["job"]) == (5, STEPS, str(job_id))
    assert calls.count == 5

    calls = DenoiserCalls(monkeypatch, unet)
    _finish(runtime, payload, redelivered=True)
    done = _row(db, job_id)
    manifest = done.manifest
    print(f"resumed: {manifest.get('resumes')}; denoiser calls {calls.count}")
    assert done.status == JobStatus.SUCCEEDED
    assert [r["from_step"] for r in manifest["resumes"]] == [5]
    assert manifest["resumes"][0]["worker"] == runtime.name
    assert calls.count == STEPS - 5 + 1  # the steps left, and one for the skipped ones' shape
    assert _image(runtime, done) == expected
    assert done.checkpoint_step is None
    with pytest.raises(StorageError):
        runtime.storage.get(key)


def _valid_state(runtime, db, monkeypatch, seed: int):
    """A job stopped at step 4 by a drain: its row names the checkpoint, and its state."""
    unet = runtime.models["tiny"].pipeline.unet
    job_id, payload = _new_job(db, seed)
    DenoiserCalls(monkeypatch, unet, at_call=lambda n: n == 4 and runtime.request_drain())
    try:
        assert _finish(runtime, payload).verdict == execute.Verdict.REQUEUE
    finally:
        _drained(runtime)
    monkeypatch.undo()
    job = _row(db, job_id)
    key = checkpoint_key(job.tenant_id, job_id)
    return job_id, payload, key, denoise_state.loads(runtime.storage.get(key))


def _layout(number: int) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save({"format": number}, buffer)
    return buffer.getvalue()


def _with_meta(state, **meta):
    return denoise_state.dumps(replace(state, meta={**state.meta, **meta}))


BAD = {
    "missing": (None, "missing from the store"),
    "truncated": (lambda blob, state: blob[: len(blob) // 3], "unreadable"),
    "another model": (
        lambda blob, state: _with_meta(state, model_sha256="0" * 64),
        "its model_sha256 is",
    ),
    "another version": (lambda blob, state: _with_meta(state, diffq="0.0.1"), "its diffq is"),
    "another layout": (lambda blob, state: _layout(2), "layout 2"),
    "not a checkpoint": (lambda blob, state: b"GIF89a", "unreadable"),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_a_bad_checkpoint_starts_the_job_afresh_and_says_why(
    runtime, db, monkeypatch, reference, bad
):
    seed = 30 + list(BAD).index(bad)
    expected = reference(seed)
    job_id, payload, key, state = _valid_state(runtime, db, monkeypatch, seed)
    spoil, reason = BAD[bad]
    if spoil is None:
        runtime.storage.delete(key)
    else:
        runtime.storage.put(key, spoil(runtime.storage.get(key), state), "application/x")
    _finish(runtime, payload, redelivered=True)
    done = _row(db, job_id)
    manifest = done.manifest
    print(f"{bad}: {manifest.get('resume_note')}")
    assert done.status == JobStatus.SUCCEEDED and done.attempts == 1
    assert "resumes" not in manifest
    assert reason in manifest["resume_note"] and "started afresh" in manifest["resume_note"]
    assert _image(runtime, done) == expected  # from step 0: the same bytes
    assert done.checkpoint_step is None


def test_a_checkpoint_left_by_a_job_that_ended_elsewhere_is_removed(runtime, db, monkeypatch):
    job_id, _payload, key, _state = _valid_state(runtime, db, monkeypatch, seed=40)
    with db.session() as session:
        session.get(Job, job_id).status = JobStatus.CANCELED  # canceled while queued
    running_id, _p, running_key, _s = _valid_state(runtime, db, monkeypatch, seed=41)
    removed = remove_left_checkpoints(db, runtime.storage)
    assert removed >= 1
    assert _row(db, job_id).checkpoint_step is None
    with pytest.raises(StorageError):
        runtime.storage.get(key)
    # A job that may still run keeps its own.
    assert _row(db, running_id).checkpoint_step == 4
    assert denoise_state.loads(runtime.storage.get(running_key)).step == 4


def test_checkpoints_are_saved_every_interval_while_a_job_runs(runtime, db, monkeypatch):
    """With an interval shorter than a step, a save is due at every step: each is
    uploaded off the GPU's path (one at a time, the others skipped), the row follows the
    stored one, and the job's end removes it."""
    model = runtime.models["tiny"]
    monkeypatch.setattr(model, "spec", replace(model.spec, checkpoint_seconds=1e-9))
    stored: list[int] = []
    put = runtime.storage.put

    def counting_put(key, data, content_type):
        if key.endswith("checkpoint.pt"):
            stored.append(denoise_state.loads(data).step)
        return put(key, data, content_type)

    monkeypatch.setattr(runtime.storage, "put", counting_put)
    job_id, payload = _new_job(db, seed=50)
    _finish(runtime, payload)
    done = _row(db, job_id)
    print(f"checkpoints stored at steps {stored}")
    assert done.status == JobStatus.SUCCEEDED
    assert stored and stored == sorted(stored) and set(stored) <= set(range(1, STEPS))
    assert done.checkpoint_step is None
    with pytest.raises(StorageError):
        runtime.storage.get(checkpoint_key(done.tenant_id, job_id))


def test_a_run_that_loses_its_job_stores_nothing_as_it_leaves(runtime, db, monkeypatch):
    """Canceled (or taken over by another run) mid-job: the run stops at its next step
    and stores no checkpoint (nothing resumes a canceled job, and a taken-over job is in
    another run's hands); only a hand-back stores one as it leaves."""
    unet = runtime.models["tiny"].pipeline.unet
    job_id, payload = _new_job(db, seed=60)

    def cancel(n: int) -> None:
        if n == 5:
            with db.session() as session:
                session.get(Job, job_id).status = JobStatus.CANCELED
            runtime.on_cancel(None, str(job_id))

    DenoiserCalls(monkeypatch, unet, at_call=cancel)
    stored: list[str] = []
    put = runtime.storage.put

    def counting_put(key, data, content_type):
        stored.append(key)
        return put(key, data, content_type)

    monkeypatch.setattr(runtime.storage, "put", counting_put)
    outcome = _finish(runtime, payload)
    job = _row(db, job_id)
    print(f"canceled at step 5: {outcome.verdict} ({outcome.reason}); stored {stored}")
    assert outcome.verdict == execute.Verdict.DISCARD
    assert stored == []
    assert job.status == JobStatus.CANCELED and job.checkpoint_step is None
    with pytest.raises(StorageError):
        runtime.storage.get(checkpoint_key(job.tenant_id, job_id))


def test_an_upload_that_ends_after_its_job_did_removes_what_it_wrote(runtime, db, monkeypatch):
    """A periodic save still uploading when its job ended (or another run took it over):
    the row no longer takes it, and nothing would ever remove it, so the upload does."""
    from workers.checkpoints import JobCheckpoints

    job_id, _payload = _new_job(db, seed=70)
    with db.session() as session:
        session.get(Job, job_id).status = JobStatus.SUCCEEDED  # it ended meanwhile
    job = _row(db, job_id)
    stored: list[str] = []
    put = runtime.storage.put
    monkeypatch.setattr(
        runtime.storage, "put", lambda key, *a: (stored.append(key), put(key, *a))[1]
    )
    checkpoints = JobCheckpoints(runtime, job, runtime.models["tiny"])
    state = denoise_state.DenoiseState(3, STEPS, torch.zeros(1, 4, 8, 8), {}, [])
    checkpoints.save(state, leaving=False)
    checkpoints.wait()
    key = checkpoint_key(job.tenant_id, job_id)
    assert stored == [key]  # written, then
    with pytest.raises(StorageError):
        runtime.storage.get(key)  # removed
    assert checkpoints.stored_step is None and _row(db, job_id).checkpoint_step is None


def _hears_it(runtime, job_id) -> None:
    """Called from the denoiser of the step after a yield was asked: the run has heard
    it by now, at the latest here. PostgreSQL's NOTIFY may come during either step; on
    SQLite the run hears it with the write of the step just ended (its RETURNING), and
    the write must not wait on this step, so the ask is made one step earlier and this
    step only waits for it (the run then stores its state at the end of this one)."""
    wait_until(lambda: runtime.leaving(job_id), timeout=30, what="the run hears it")


def _set_paused(runtime, *, now: bool | None) -> None:
    """Pause model `tiny` (`now`: its running jobs yield), or resume it (None)."""
    from app.jobs import pauses

    with runtime.db.session() as session:
        if now is None:
            pauses.resume(session, runtime.catalog, ["tiny"])
        else:
            pauses.pause(session, runtime.catalog, ["tiny"], now=now, reason="a test")


def _queue_info(db, job_id):
    from app.jobs.queue_info import queue_info

    with db.session() as session:
        return queue_info(session, session.get(Job, job_id))


def test_a_model_paused_now_sends_its_job_back_with_a_checkpoint_to_resume_from(
    runtime, db, monkeypatch, reference
):
    """Paused `now` at step 5: the run hears it (NOTIFY, or its next progress write on
    SQLite), stores its state and goes back to the queue without spending an attempt.
    While paused, a delivery of it goes back unclaimed, and it waits in its place with no
    ETA. Resumed, it runs the steps left and gives the uninterrupted run's bytes."""
    expected = reference(seed=80)
    unet = runtime.models["tiny"].pipeline.unet
    job_id, payload = _new_job(db, seed=80)

    def pause_now(n: int) -> None:
        if n == 5:
            _set_paused(runtime, now=True)
        elif n == 6:
            _hears_it(runtime, job_id)

    DenoiserCalls(monkeypatch, unet, at_call=pause_now)
    try:
        outcome = _finish(runtime, payload)
        handed = _row(db, job_id)
        print(f"paused now: {outcome.verdict} ({outcome.reason}); at {handed.checkpoint_step}")
        assert outcome.verdict == execute.Verdict.REQUEUE
        assert handed.status == JobStatus.QUEUED and handed.checkpoint_step in (5, 6)
        assert handed.attempts == 0 and handed.yield_reason is None
        monkeypatch.undo()

        again = _finish(runtime, payload, redelivered=True)
        waiting = _row(db, job_id)
        paused_info = _queue_info(db, job_id)
        print(f"delivered while paused: {again.reason}; queue {paused_info}")
        assert again.verdict == execute.Verdict.REQUEUE and "paused" in again.reason
        assert waiting.status == JobStatus.QUEUED and waiting.attempts == 0
        assert paused_info.paused is True and paused_info.eta_seconds is None
    finally:
        _set_paused(runtime, now=None)
    resumed_info = _queue_info(db, job_id)
    assert resumed_info.paused is False and resumed_info.position == paused_info.position

    calls = DenoiserCalls(monkeypatch, unet)
    _finish(runtime, payload, redelivered=True)
    done = _row(db, job_id)
    assert done.status == JobStatus.SUCCEEDED and done.attempts == 1
    assert [r["from_step"] for r in done.manifest["resumes"]] == [handed.checkpoint_step]
    assert calls.count == STEPS - handed.checkpoint_step + 1
    assert _image(runtime, done) == expected
    assert done.checkpoint_step is None


def test_a_model_paused_without_now_lets_its_running_job_finish(runtime, db, monkeypatch):
    unet = runtime.models["tiny"].pipeline.unet
    job_id, payload = _new_job(db, seed=90)
    DenoiserCalls(monkeypatch, unet, at_call=lambda n: n == 5 and _set_paused(runtime, now=False))
    try:
        outcome = _finish(runtime, payload)
    finally:
        _set_paused(runtime, now=None)
    done = _row(db, job_id)
    print(f"paused, not now: {outcome.verdict}; {done.status}")
    assert done.status == JobStatus.SUCCEEDED and "resumes" not in done.manifest
    assert not runtime.leaving(job_id)


def _urgent_job(db, seed: int, waited: float = 60.0):
    """A `high` job that has waited `waited` seconds for a worker."""
    from datetime import timedelta

    from app.db.types import utcnow

    job_id, payload = _new_job(db, seed)
    with db.session() as session:
        job = session.get(Job, job_id)
        job.priority = Priority.HIGH
        job.created_at = utcnow() - timedelta(seconds=waited)
    return job_id, payload


def _preempt(runtime, **rule) -> int:
    from app.housekeeping.preemption import preempt_for_urgent

    rule = {"after_seconds": 5.0, "min_left_seconds": 0.0, "max_preemptions": 2, **rule}
    return preempt_for_urgent(runtime.db, runtime.catalog, **rule)


def _queue_idle(db) -> None:
    """No other module's job runs or waits `high` on gpu.tiny: the session's worker
    process serves that queue from the same database, and one still running there was a
    candidate to yield (or counted as yielding) in the pass these tests make."""
    from sqlalchemy import func, or_, select

    with db.session() as session:
        ours = get_or_create_tenant(session, "checkpoint-tests").id

    def idle() -> bool:
        with db.session() as session:
            busy = session.scalar(
                select(func.count())
                .select_from(Job)
                .where(
                    Job.queue == "gpu.tiny",
                    Job.tenant_id != ours,
                    or_(
                        Job.status == JobStatus.RUNNING,
                        (Job.status == JobStatus.QUEUED) & (Job.priority == Priority.HIGH),
                    ),
                )
            )
        return busy == 0

    wait_until(idle, timeout=180, what="gpu.tiny idle of other tests' jobs")


def _denoising(db, job_id) -> bool:
    progress = _row(db, job_id).progress or {}
    return progress.get("stage") == "denoising" and progress.get("step", 0) >= 1


def test_an_urgent_job_waiting_makes_a_long_job_yield_and_the_long_one_resumes(
    runtime, db, monkeypatch, reference
):
    """The relay's preemption pass: a `high` job waiting with no free worker makes the
    running `normal` job checkpoint and go back (one preemption counted, no attempt
    spent); the urgent job runs; the long one resumes from its step with the
    uninterrupted run's bytes. A job at its preemption cap, or `high` itself, is left to
    run, and a job waiting less than DIFFQ_PREEMPT_AFTER makes nothing yield."""
    expected = reference(seed=100)
    unet = runtime.models["tiny"].pipeline.unet
    _queue_idle(db)
    job_id, payload = _new_job(db, seed=100)
    urgent_id, urgent_payload = _urgent_job(db, seed=101)
    asked: list[int] = []

    def preempt(n: int) -> None:
        if n == 5:
            wait_until(lambda: _denoising(db, job_id), timeout=30, what="its progress")
            asked.append(_preempt(runtime, after_seconds=3600.0))  # waited too little
            asked.append(_preempt(runtime))
        elif n == 6:
            _hears_it(runtime, job_id)

    DenoiserCalls(monkeypatch, unet, at_call=preempt)
    outcome = _finish(runtime, payload)
    monkeypatch.undo()
    handed = _row(db, job_id)
    print(f"preempted: {outcome.reason}; asked {asked}; at step {handed.checkpoint_step}")
    assert asked == [0, 1]
    assert outcome.verdict == execute.Verdict.REQUEUE
    assert handed.status == JobStatus.QUEUED and handed.checkpoint_step in (5, 6)
    assert handed.preemptions == 1 and handed.attempts == 0

    _finish(runtime, urgent_payload)
    assert _row(db, urgent_id).status == JobStatus.SUCCEEDED
    _finish(runtime, payload, redelivered=True)
    done = _row(db, job_id)
    assert done.status == JobStatus.SUCCEEDED
    assert [r["from_step"] for r in done.manifest["resumes"]] == [handed.checkpoint_step]
    assert _image(runtime, done) == expected


@pytest.mark.parametrize("spared", ["at its cap", "high itself"])
def test_preemption_spares_a_job_at_its_cap_and_a_high_one(runtime, db, monkeypatch, spared):
    unet = runtime.models["tiny"].pipeline.unet
    seed = 110 + ["at its cap", "high itself"].index(spared)
    _queue_idle(db)
    job_id, payload = _new_job(db, seed)
    with db.session() as session:
        job = session.get(Job, job_id)
        if spared == "at its cap":
            job.preemptions = 2
        else:
            job.priority = Priority.HIGH
    urgent_id, _urgent_payload = _urgent_job(db, seed + 10)
    asked: list[int] = []

    def preempt(n: int) -> None:
        if n == 5:
            wait_until(lambda: _denoising(db, job_id), timeout=30, what="its progress")
            asked.append(_preempt(runtime))

    DenoiserCalls(monkeypatch, unet, at_call=preempt)
    try:
        _finish(runtime, payload)
    finally:
        with db.session() as session:  # the urgent job must not wait on this module's queue
            session.get(Job, urgent_id).status = JobStatus.CANCELED
    print(f"{spared}: asked {asked}")
    assert asked == [0]
    assert _row(db, job_id).status == JobStatus.SUCCEEDED


def _long_model(runtime, monkeypatch):
    """The tiny model with a budget of ten consumer timeouts: its deliveries hand back."""
    model = runtime.models["tiny"]
    timeout = runtime.settings.broker_consumer_timeout
    spec = replace(model.spec, soft_time_limit=10 * timeout, time_limit=10 * timeout + 60)
    assert spec.spans_deliveries and spec.delivery_limits(timeout)[0] < spec.soft_time_limit
    monkeypatch.setattr(model, "spec", spec)
    return timeout


def test_a_delivery_near_the_consumer_timeout_hands_its_job_back_and_the_next_resumes(
    runtime, db, monkeypatch, reference
):
    """Its delivery's clock past `consumer_timeout - hand_back_margin` at step 5: the job
    stores its state and goes back (no attempt spent, no preemption counted, the
    delivery's seconds added to its budget's); the next delivery resumes at step 5, says
    why in the manifest, and makes the uninterrupted run's bytes."""
    expected = reference(seed=120)
    timeout = _long_model(runtime, monkeypatch)
    job_id, payload = _new_job(db, seed=120)

    def late(n: int) -> None:
        if n == 5 and not calls.late:  # as if it had held its message a whole timeout
            calls.late = True
            runtime.delivery_started -= timeout

    calls = DenoiserCalls(monkeypatch, runtime.models["tiny"].pipeline.unet, at_call=late)
    calls.late = False
    outcome = _finish(runtime, payload)
    handed = _row(db, job_id)
    print(f"{outcome.reason}; checkpoint {handed.checkpoint_step}; {handed.spent_seconds:.1f}s")
    assert outcome.verdict == execute.Verdict.REQUEUE
    assert "consumer_timeout" in outcome.reason
    assert handed.status == JobStatus.QUEUED and handed.checkpoint_step == 5
    assert handed.attempts == 0 and handed.preemptions == 0
    assert timeout <= handed.spent_seconds < timeout + 60
    assert calls.count == 5
    state = denoise_state.loads(runtime.storage.get(checkpoint_key(handed.tenant_id, job_id)))
    assert state.meta["left"] == "consumer_timeout"

    _finish(runtime, payload, redelivered=True)
    done = _row(db, job_id)
    resumes = done.manifest["resumes"]
    print(f"resumed: {resumes}")
    assert done.status == JobStatus.SUCCEEDED and done.attempts == 1
    assert [(r["from_step"], r["reason"]) for r in resumes] == [(5, "consumer_timeout")]
    assert _image(runtime, done) == expected
    assert done.spent_seconds == handed.spent_seconds  # only a hand-back adds


def test_a_deliverys_soft_limit_with_budget_left_hands_the_job_back(
    runtime, db, monkeypatch, reference
):
    """Celery's soft limit of one delivery (inside the consumer_timeout, below the model's
    budget) comes mid-step: the job goes back to the queue rather than failing, and runs
    again from its last checkpoint (none here: from its first step, the same bytes). A
    model whose delivery carries its own limit fails with `timeout` as before."""
    from celery.exceptions import SoftTimeLimitExceeded

    expected = reference(seed=121)
    _long_model(runtime, monkeypatch)
    job_id, payload = _new_job(db, seed=121)

    def soft_limit(n: int) -> None:
        if n == 5:
            raise SoftTimeLimitExceeded()

    unet = runtime.models["tiny"].pipeline.unet
    DenoiserCalls(monkeypatch, unet, at_call=soft_limit)
    outcome = _finish(runtime, payload)
    handed = _row(db, job_id)
    print(f"{outcome.reason}; {handed.spent_seconds:.2f}s spent")
    assert outcome.verdict == execute.Verdict.REQUEUE and "time limit" in outcome.reason
    assert handed.status == JobStatus.QUEUED and handed.attempts == 0
    assert handed.spent_seconds > 0
    monkeypatch.undo()
    _finish(runtime, payload, redelivered=True)
    done = _row(db, job_id)
    assert done.status == JobStatus.SUCCEEDED and _image(runtime, done) == expected

    own_id, own_payload = _new_job(db, seed=122)  # the tiny model's own limits (60 s)
    DenoiserCalls(monkeypatch, unet, at_call=soft_limit)
    outcome = _finish(runtime, own_payload)
    failed = _row(db, own_id)
    assert outcome.verdict == execute.Verdict.DEAD_LETTER
    assert failed.status == JobStatus.FAILED and failed.error_code == "timeout"
    assert failed.error_message == "the job exceeded its time limit of 60s"


@pytest.mark.parametrize("when", ["at its start", "at a step"])
def test_a_spent_budget_across_deliveries_fails_the_job_with_timeout(
    runtime, db, monkeypatch, when
):
    """The model's soft_time_limit (60 s for the tiny model) is a budget of running
    seconds over every delivery: a delivery that starts with it spent fails the job
    without a step; one that spends it fails the job at its next step boundary."""
    job_id, payload = _new_job(db, seed=130 + (when == "at a step"))
    limit = runtime.models["tiny"].spec.soft_time_limit
    with db.session() as session:
        session.get(Job, job_id).spent_seconds = limit if when == "at its start" else limit / 2

    def spend(n: int) -> None:
        if n == 5:  # the rest of the budget spent by this delivery
            runtime.delivery_started -= limit / 2

    calls = DenoiserCalls(monkeypatch, runtime.models["tiny"].pipeline.unet, at_call=spend)
    outcome = _finish(runtime, payload)
    failed = _row(db, job_id)
    print(f"{when}: {outcome.reason}; denoiser calls {calls.count}")
    assert outcome.verdict == execute.Verdict.DEAD_LETTER
    assert failed.status == JobStatus.FAILED and failed.error_code == "timeout"
    assert failed.error_message == f"the job exceeded its time limit of {limit}s"
    assert failed.attempts == 1 and failed.checkpoint_step is None
    assert calls.count == (0 if when == "at its start" else 5)
