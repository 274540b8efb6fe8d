"""The worker's execution of one message, in this process, on a fake pipeline: no broker,
no S3, no worker process, no model weights (SQLite and local files; see
testbed/factories.py). Each test is a few hundred milliseconds."""

from __future__ import annotations

import pytest

from app.db.models.jobs import Job
from app.jobs import transitions
from app.jobs.states import ErrorCode, JobStatus
from testbed import factories
from workers.execute import Verdict, execute_job


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("inprocess")


@pytest.fixture(scope="module")
def settings(home):
    # Progress written at every step; a cancel is seen at the next one.
    return factories.settings_for(home, progress_interval="0", upload_retries="1")


@pytest.fixture(scope="module")
def db(settings):
    database = factories.database(settings)
    yield database
    database.dispose()


@pytest.fixture
def pipeline():
    return factories.FakePipeline()


@pytest.fixture
def rt(settings, db, pipeline):
    return factories.runtime(settings, db, pipeline)


@pytest.fixture
def tenant(db):
    return factories.tenant(db)


def _job(rt, job_id) -> Job:
    with rt.db.session() as session:
        job = session.get(Job, job_id)
        session.expunge(job)
        return job


def _run(rt, tenant, job_id, *, redelivered=False):
    return execute_job(rt, factories.message(job_id, tenant), redelivered=redelivered)


def _spec(rt):
    return rt.catalog.models[factories.MODEL]


def test_a_job_runs_to_a_stored_result(rt, tenant, pipeline):
    job_id = factories.queued_job(rt.db, tenant, _spec(rt), num_images=2)
    outcome = _run(rt, tenant, job_id)
    job = _job(rt, job_id)
    assert outcome.verdict == Verdict.ACK, outcome
    assert job.status == JobStatus.SUCCEEDED
    assert job.attempts == 1
    keys = [image["key"] for image in job.result["images"]]
    assert len(keys) == 2 and len(set(keys)) == 2
    for key in keys:
        assert rt.storage.path(key).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pipeline.decodes == 1


def test_a_cancel_stops_the_run_before_any_decode(rt, tenant, pipeline):
    spec = _spec(rt)
    job_id = factories.queued_job(rt.db, tenant, spec, steps=8)

    def cancel(_step):
        with rt.db.session() as session:
            job = session.get(Job, job_id)
            transitions.cancel_job(session, job, code=ErrorCode.CANCELED, message="by the test")
        rt.on_cancel(None, str(job_id))  # what the LISTEN/NOTIFY listener does

    pipeline.at_step[3] = cancel
    outcome = _run(rt, tenant, job_id)
    job = _job(rt, job_id)
    print(f"\ncanceled at step 3 of 8: verdict {outcome.verdict}, decodes {pipeline.decodes}")
    assert outcome.verdict == Verdict.DISCARD  # acked, and not a success for monitors
    assert job.status == JobStatus.CANCELED
    assert pipeline.calls == 1 and pipeline.decodes == 0
    assert job.result is None


def test_a_shutdown_hands_the_job_back_to_the_queue(rt, tenant, pipeline):
    job_id = factories.queued_job(rt.db, tenant, _spec(rt), steps=8)
    pipeline.at_step[2] = lambda _step: rt.request_hand_back()
    outcome = _run(rt, tenant, job_id)
    job = _job(rt, job_id)
    assert outcome.verdict == Verdict.REQUEUE
    assert job.status == JobStatus.QUEUED
    assert job.lease_owner is None
    assert pipeline.decodes == 0
    # The module's queue left empty: a queued job would be the fair choice of later tests'
    # messages.
    with rt.db.session() as session:
        session.get(Job, job_id).status = JobStatus.CANCELED


def test_out_of_memory_fails_the_job_and_the_next_one_runs(rt, tenant, pipeline):
    import torch

    spec = _spec(rt)
    first = factories.queued_job(rt.db, tenant, spec)

    def out_of_memory(_step):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    pipeline.at_step[2] = out_of_memory
    outcome = _run(rt, tenant, first)
    assert outcome.verdict == Verdict.DEAD_LETTER
    assert _job(rt, first).error_code == ErrorCode.GPU_OOM.value

    pipeline.at_step.clear()
    second = factories.queued_job(rt.db, tenant, spec)
    assert _run(rt, tenant, second).verdict == Verdict.ACK
    assert _job(rt, second).status == JobStatus.SUCCEEDED


def test_a_crash_in_the_pipeline_fails_the_job_as_internal(rt, tenant, pipeline):
    job_id = factories.queued_job(rt.db, tenant, _spec(rt))

    def crash(_step):
        raise RuntimeError("a kernel fault")

    pipeline.at_step[1] = crash
    outcome = _run(rt, tenant, job_id)
    job = _job(rt, job_id)
    assert outcome.verdict == Verdict.DEAD_LETTER
    assert job.status == JobStatus.FAILED and job.error_code == ErrorCode.INTERNAL.value


def test_a_finished_jobs_message_is_acked_without_a_run(rt, tenant, pipeline):
    job_id = factories.queued_job(rt.db, tenant, _spec(rt))
    assert _run(rt, tenant, job_id).verdict == Verdict.ACK
    again = _run(rt, tenant, job_id, redelivered=True)  # a duplicate delivery
    assert again.verdict == Verdict.DISCARD  # acked, and not a second success
    assert pipeline.calls == 1
    assert _job(rt, job_id).attempts == 1


@pytest.mark.parametrize(
    "raw",
    [
        "not an object",
        {"v": 99, "job_id": "00000000-0000-0000-0000-000000000001"},
        {"job_id": "not-a-uuid"},
    ],
)
def test_a_broken_message_is_dead_lettered_without_a_run(rt, pipeline, raw):
    outcome = execute_job(rt, raw, redelivered=False)
    assert outcome.verdict == Verdict.DEAD_LETTER
    assert "invalid message" in outcome.reason
    assert pipeline.calls == 0


def test_a_broken_message_for_a_known_job_fails_that_job(rt, tenant, pipeline):
    job_id = factories.queued_job(rt.db, tenant, _spec(rt))
    outcome = execute_job(rt, {"v": 99, "job_id": str(job_id)}, redelivered=False)
    job = _job(rt, job_id)
    assert outcome.verdict == Verdict.DEAD_LETTER
    assert job.status == JobStatus.FAILED
    assert job.error_code == ErrorCode.INVALID_MESSAGE.value
    assert pipeline.calls == 0


def test_post_processing_records_the_result_after_the_ack(settings, db, tenant):
    pipeline = factories.FakePipeline()
    rt = factories.runtime(settings, db, pipeline, postprocess=True)
    job_id = factories.queued_job(db, tenant, _spec(rt))
    outcome = _run(rt, tenant, job_id)
    assert outcome.verdict == Verdict.HANDED_OVER  # acked; the lease covers the rest
    rt.postprocessor.close(timeout=30)
    job = _job(rt, job_id)
    assert job.status == JobStatus.SUCCEEDED
    assert rt.storage.path(job.result["images"][0]["key"]).exists()


def test_a_job_whose_adapter_was_deleted_fails_invalid_input_and_is_not_retried(rt, tenant):
    from app.addons.lora import Lora

    gone = Lora("0" * 64, 0.8)  # named by the job, no longer in the store
    job_id = factories.queued_job(rt.db, tenant, _spec(rt), loras=(gone,))
    outcome = _run(rt, tenant, job_id)
    job = _job(rt, job_id)
    assert outcome.verdict != Verdict.REQUEUE, outcome
    assert job.status == JobStatus.FAILED and job.error_code == ErrorCode.INVALID_INPUT.value
    assert "no longer stored" in job.error_message
    assert gone.sha256 not in rt.adapter_memory  # nothing was loaded
