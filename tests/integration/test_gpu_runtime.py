"""A worker runtime in this process, on the real database and store.

Out of memory heals: the job fails `gpu_oom` (dead-lettered, never retried), what the run
held is released, and the next job on the same runtime succeeds. Images the safety checker
blacked out are flagged, never silently "succeeded"."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch

from app.broker.payload import build_payload
from app.db.models.jobs import Job
from app.jobs.service import create_job
from app.jobs.states import ErrorCode, JobStatus, Priority
from app.keys import get_or_create_tenant
from app.kinds import request_from_stored
from workers import execute, run

pytestmark = pytest.mark.services

OOM_ERRORS = {
    "torch_oom": lambda: torch.cuda.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.11 GiB total capacity)"
    ),
    "cublas_alloc": lambda: RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    ),
}


@pytest.fixture(scope="module")
def runtime(stack):
    from app.config import load_settings
    from app.services import Services
    from workers.runtime import build_runtime

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rt = build_runtime(Services(load_settings()), ["gpu.tiny"])
    yield rt
    rt.close()  # its cancel listener too, before the database goes
    torch.set_num_threads(threads)


def _new_job(db, **params):
    full = {
        "prompt": "a lighthouse",
        "negative_prompt": None,
        "model": "tiny",
        "width": 64,
        "height": 64,
        "steps": 3,
        "guidance_scale": 7.5,
        "seed": 1,
        "num_images": 1,
        "scheduler": "default",
        "output_format": "png",
        "priority": "normal",
        **params,
    }
    with db.session() as session:
        tenant = get_or_create_tenant(session, "oom-tests")
        job = create_job(
            session,
            tenant.id,
            model="tiny",
            queue="gpu.tiny",
            priority=Priority.NORMAL,
            request=request_from_stored(full),
            metadata=None,
        )
        return job.id, build_payload(job)


def _recorded(runtime) -> None:
    """Wait for the post-processing thread (encode, upload, record) to finish."""
    if runtime.postprocessor is not None:
        assert runtime.postprocessor.drain(timeout=60)


@pytest.mark.parametrize("kind", sorted(OOM_ERRORS))
def test_an_oom_fails_the_job_frees_its_memory_and_the_next_job_runs(
    runtime, db, monkeypatch, kind
):
    unet = runtime.models["tiny"].pipeline.unet
    held: list[weakref.ref] = []
    forward = unet.forward

    def out_of_memory(*args, **kwargs):
        activations = torch.ones(8, 1024, 1024)  # 32 MiB that only the traceback holds
        held.append(weakref.ref(activations))
        raise OOM_ERRORS[kind]()

    alive_when_freed: list[bool] = []
    free = run.free_accelerator_memory

    def probe() -> None:
        free()
        alive_when_freed.append(held[0]() is not None)

    monkeypatch.setattr(unet, "forward", out_of_memory)
    monkeypatch.setattr(run, "free_accelerator_memory", probe)
    job_id, payload = _new_job(db)
    outcome = execute.execute_job(runtime, payload, redelivered=False)
    monkeypatch.setattr(unet, "forward", forward)
    with db.session() as session:
        failed = session.get(Job, job_id)
        status, code, attempts = failed.status, failed.error_code, failed.attempts
    print(f"{kind}: {outcome.verdict} {outcome.reason}; freed, tensor alive: {alive_when_freed}")
    assert status == JobStatus.FAILED and code == ErrorCode.GPU_OOM.value
    assert outcome.verdict == execute.Verdict.DEAD_LETTER  # never requeued, never retried
    assert attempts == 1
    # The memory went back once the traceback was dropped, not while it pinned the tensors.
    assert alive_when_freed == [False]

    next_id, next_payload = _new_job(db, seed=2)
    assert execute.execute_job(runtime, next_payload, redelivered=False).verdict == "handed_over"
    _recorded(runtime)
    with db.session() as session:
        assert session.get(Job, next_id).status == JobStatus.SUCCEEDED
    gc.collect()


@pytest.mark.parametrize("flags", [[True, True], [True, False]])
def test_blacked_out_images_never_pass_silently(runtime, db, monkeypatch, flags):
    pipeline = runtime.models["tiny"].pipeline

    def checker(image, device, dtype):
        return image * 0, flags

    monkeypatch.setattr(pipeline, "run_safety_checker", checker)
    job_id, payload = _new_job(db, num_images=2, steps=1)
    outcome = execute.execute_job(runtime, payload, redelivered=False)
    _recorded(runtime)
    with db.session() as session:
        job = session.get(Job, job_id)
        status, code, result = job.status, job.error_code, job.result
    print(f"flags {flags}: {status.value} {code or ''} {outcome.reason}")
    if all(flags):
        assert status == JobStatus.FAILED and code == ErrorCode.CONTENT_FILTERED.value
    else:
        assert status == JobStatus.SUCCEEDED
        assert [i.get("nsfw_filtered", False) for i in result["images"]] == flags


def test_the_next_job_starts_while_the_last_one_is_uploaded(runtime, db, monkeypatch):
    """execute_job returns (the message is acked, the GPU is free) before the upload ends;
    the outcome is recorded afterwards, by the post-processing thread."""
    assert runtime.postprocessor is not None  # on by default (DIFFQ_POSTPROCESS_DEPTH=2)
    put = runtime.storage.put
    release = threading.Event()

    def slow_put(*args, **kwargs):
        release.wait(30)
        return put(*args, **kwargs)

    monkeypatch.setattr(runtime.storage, "put", slow_put)
    job_id, payload = _new_job(db, seed=3)
    outcome = execute.execute_job(runtime, payload, redelivered=False)
    with db.session() as session:
        during = session.get(Job, job_id)
        status, owner = during.status, during.lease_owner
    release.set()
    _recorded(runtime)
    with db.session() as session:
        after = session.get(Job, job_id)
        final, images = after.status, (after.result or {}).get("images", [])
    print(f"returned: {outcome.reason}; row then {status.value}, after the drain {final.value}")
    assert outcome.verdict == execute.Verdict.HANDED_OVER
    assert status == JobStatus.RUNNING and owner == runtime.owner  # still leased, not lost
    assert final == JobStatus.SUCCEEDED and len(images) == 1


def test_an_outcome_the_database_refuses_ends_the_job_at_once(runtime, db, monkeypatch):
    """A value PostgreSQL cannot store (here a NUL in the manifest, which JSONB refuses)
    would be refused on every retry and every run: the job ends failed with
    `outcome_refused` on its first run and its dead letter is written, instead of going
    back through lease expiry three times. A non-finite float, which JSON cannot say,
    is stored as a string."""
    model = runtime.models["tiny"]
    manifest = dict(model.manifest or {})
    letters = []
    monkeypatch.setattr(runtime, "dead_letter", lambda job, reason: letters.append(reason))
    monkeypatch.setattr(model, "manifest", {**manifest, "note": "a\x00b"})
    job_id, payload = _new_job(db, seed=4)
    outcome = execute.execute_job(runtime, payload, redelivered=False)
    _recorded(runtime)
    with db.session() as session:
        job = session.get(Job, job_id)
        status, code, attempts, lease = job.status, job.error_code, job.attempts, job.lease_owner
    print(f"refused: {status.value} {code} after {attempts} run(s); {outcome.reason}; {letters}")
    assert status == JobStatus.FAILED and code == ErrorCode.OUTCOME_REFUSED.value
    assert attempts == 1 and lease is None
    if runtime.postprocessor is not None:  # failed after the hand-over: its dead letter
        assert outcome.verdict == execute.Verdict.HANDED_OVER and len(letters) == 1
    else:  # inline: the task dead-letters the message itself
        assert outcome.verdict == execute.Verdict.DEAD_LETTER and letters == []

    monkeypatch.setattr(model, "manifest", {**manifest, "floor": float("-inf")})
    job_id, payload = _new_job(db, seed=5)
    execute.execute_job(runtime, payload, redelivered=False)
    _recorded(runtime)
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job.status == JobStatus.SUCCEEDED, (job.error_code, job.error_message)
        assert job.manifest["floor"] == "-Infinity"


def test_a_connection_cut_while_recording_the_model_digest_is_ridden_out(stack, monkeypatch):
    """A pool process starting while PostgreSQL drops its connection (a restart, a storm
    of terminated backends) waits for it, as an outcome's write does: a model that loaded
    is not a model that cannot load, which would stop the worker for good."""
    from sqlalchemy import select
    from sqlalchemy.exc import OperationalError

    from app.config import load_settings
    from app.db.models.fleet import ModelDigest
    from app.services import Services
    from workers import runtime as runtime_module

    calls = []
    original = runtime_module.record_model_digest

    def cut_once(session, name, digest):
        calls.append(name)
        if len(calls) == 1:
            raise OperationalError("INSERT INTO model_digests", {}, Exception("server closed"))
        return original(session, name, digest)

    monkeypatch.setattr(runtime_module, "record_model_digest", cut_once)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rt = runtime_module.build_runtime(Services(load_settings()), ["gpu.tiny"])
    finally:
        torch.set_num_threads(threads)
    try:
        assert len(calls) >= 2 and calls[0] == calls[1]  # the write ran again
        with rt.db.session() as session:
            assert session.scalar(select(ModelDigest.digest).where(ModelDigest.model == "tiny"))
    finally:
        rt.close()  # its cancel listener too, before the database goes


def test_a_pool_process_frozen_mid_transaction_loses_its_session_not_its_jobs_row(runtime):
    """The database ends a worker session that holds a transaction without sending a
    statement for half a lease (at most 30 s), so a pool process frozen between an
    UPDATE and its COMMIT releases the job's row for the reaper. The API's and the
    relay's sessions have no such limit."""
    import time

    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError

    from app.config import load_settings
    from app.services import Services

    limit = runtime.idle_transaction_seconds
    assert limit == min(30.0, max(2.0, runtime.settings.lease_seconds / 2))
    with runtime.db.sessions() as session:
        shown = session.scalar(text("SHOW idle_in_transaction_session_timeout"))
        assert shown in (f"{int(limit)}s", f"{int(limit * 1000)}ms"), shown
    api_db = Services(load_settings()).db
    try:
        with api_db.sessions() as session:
            assert session.scalar(text("SHOW idle_in_transaction_session_timeout")) == "0"
    finally:
        api_db.dispose()
    # The server ends such a session (a limit of 2 s here, not the runtime's 30).
    from app.db.session import Database

    short = Database(runtime.settings.database_url, idle_transaction_seconds=2)
    session = short.sessions()
    try:
        session.execute(text("SELECT 1"))  # a transaction is open
        time.sleep(3.5)
        with pytest.raises(OperationalError):
            session.execute(text("SELECT 1"))
    finally:
        session.close()
    try:
        with short.session() as session:  # the pool replaces the ended connection
            assert session.scalar(text("SELECT 1")) == 1
    finally:
        short.dispose()
