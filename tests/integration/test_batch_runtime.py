"""A batching model's delivery in this process, on the real database and store: the batch
takes compatible jobs from further messages, passes others back untouched, and acks each
message only once its own job's outcome is recorded (or handed over under its lease)."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
import torch
from prometheus_client import REGISTRY

from app.broker.payload import build_payload
from app.db.models.jobs import Job
from app.jobs.service import create_job
from app.jobs.states import JobStatus, Priority
from app.keys import get_or_create_tenant
from app.kinds import job_request, request_from_stored
from workers import execute

pytestmark = pytest.mark.services

QUEUE = "gpu.tiny.batch-test"  # a queue of its own: fair share sees only these jobs


@pytest.fixture(scope="module")
def runtime(stack):
    from app.config import load_settings
    from app.services import Services
    from workers.runtime import build_runtime

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rt = build_runtime(Services(load_settings()), ["gpu.tiny"])
    model = rt.models["tiny"]
    rt.models["tiny"] = replace(model, spec=replace(model.spec, max_batch=4, max_wait_ms=200))
    yield rt
    rt.close()  # its cancel listener too, before the database goes
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def leave_nothing_behind(db):
    """Jobs these tests leave queued or running (never published) end failed, so that no
    relay of the same session tries to publish them."""
    yield
    from sqlalchemy import select

    from app.jobs import transitions
    from app.jobs.states import ErrorCode

    with db.session() as session:
        open_ids = session.scalars(
            select(Job.id).where(
                Job.queue == QUEUE, Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING])
            )
        ).all()
        for job_id in open_ids:
            transitions.finish_failed(
                session, job_id, code=ErrorCode.INTERNAL, message="test left it unfinished"
            )


def _new_job(db, tenant: str, **params):
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
        owner = get_or_create_tenant(session, tenant)
        job = create_job(
            session,
            owner.id,
            model="tiny",
            queue=QUEUE,
            priority=Priority.NORMAL,
            request=request_from_stored(full),
            metadata=None,
        )
        return job.id, build_payload(job)


class FakePermit:
    def __init__(self, db, job_id, payload, owner):
        self.db, self.job_id, self.payload, self.owner = db, job_id, payload, owner
        self.redelivered = False
        self.settled: list[str] = []
        self.row_when_settled = None

    def _look(self):
        with self.db.session() as session:
            job = session.get(Job, self.job_id)
            self.row_when_settled = (job.status, job.lease_owner)

    def ack(self):
        self._look()
        self.settled.append("ack")

    def reject(self, requeue):
        self._look()
        self.settled.append("requeue" if requeue else "dead_letter")

    def pass_back(self):
        self._look()
        self.settled.append("passed")


class FakeSource:
    def __init__(self, permits):
        self.permits = list(permits)
        self.fetched = 0
        self.closed = False

    def fetch(self):
        if self.fetched < len(self.permits):
            self.fetched += 1
            return self.permits[self.fetched - 1]
        return None

    def close(self):
        self.closed = True


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name, {"model": "tiny"}) or 0.0


def test_a_batch_takes_compatible_jobs_and_acks_each_after_its_outcome(runtime, db):
    tenant = f"batch-{uuid.uuid4().hex[:8]}"
    leader_id, leader_payload = _new_job(db, tenant, seed=1)
    other_size_id, other_size = _new_job(db, tenant, width=128, height=128)
    member_ids, permits = [], []
    for seed, prompt in ((2, "a barn"), (3, "a boat"), (4, "one too many")):
        job_id, _payload = _new_job(db, tenant, seed=seed, prompt=prompt)
        member_ids.append(job_id)
    passed = FakePermit(db, other_size_id, other_size, runtime.owner)
    permits = [passed] + [
        FakePermit(db, job_id, build_payload_of(db, job_id), runtime.owner) for job_id in member_ids
    ]
    source = FakeSource(permits)
    batches, jobs = _sample("diffq_batch_size_count"), _sample("diffq_batch_size_sum")

    outcome = execute.execute_job(
        runtime, leader_payload, redelivered=False, open_permits=lambda queue: source
    )
    if runtime.postprocessor is not None:
        assert runtime.postprocessor.drain(timeout=60)

    print(f"leader {outcome}; settled {[(p.settled, p.row_when_settled) for p in permits]}")
    assert outcome.verdict == execute.Verdict.HANDED_OVER
    assert source.closed
    # max_batch 4: at most 3 messages beside the leader's, the passed one included.
    assert source.fetched == 3
    left = permits.pop()
    assert left.settled == []
    # The other size was handed back untouched and never claimed.
    assert passed.settled == ["passed"] and passed.row_when_settled[0] == JobStatus.QUEUED
    # Each member's message was acked once, when its outcome was recorded or handed over
    # under its lease (post-processing), never before.
    for permit in permits[1:]:
        assert permit.settled == ["ack"]
        status, owner = permit.row_when_settled
        assert status == JobStatus.SUCCEEDED or (
            status == JobStatus.RUNNING and owner == runtime.owner
        )
    with db.session() as session:
        rows = [session.get(Job, i) for i in [leader_id, *member_ids, other_size_id]]
        statuses = [r.status for r in rows]
        images = [r.result["images"][0]["sha256"] for r in rows[:3]]
    assert statuses == [JobStatus.SUCCEEDED] * 3 + [JobStatus.QUEUED] * 2
    assert len(set(images)) == 3  # each job its own image
    assert _sample("diffq_batch_size_count") == batches + 1
    assert _sample("diffq_batch_size_sum") == jobs + 3


def build_payload_of(db, job_id):
    with db.session() as session:
        return build_payload(session.get(Job, job_id))


def test_a_model_that_does_not_batch_never_opens_a_source(runtime, db):
    rt_model = runtime.models["tiny"]
    runtime.models["tiny"] = replace(rt_model, spec=replace(rt_model.spec, max_batch=1))
    try:
        job_id, payload = _new_job(db, f"single-{uuid.uuid4().hex[:8]}")

        def never(queue):
            raise AssertionError("a model without max_batch opened a batch source")

        outcome = execute.execute_job(runtime, payload, redelivered=False, open_permits=never)
        if runtime.postprocessor is not None:
            assert runtime.postprocessor.drain(timeout=60)
        assert outcome.verdict == execute.Verdict.HANDED_OVER
        with db.session() as session:
            assert session.get(Job, job_id).status == JobStatus.SUCCEEDED
    finally:
        runtime.models["tiny"] = rt_model


def test_a_batch_keeps_its_images_within_the_models_pixel_budget(runtime, db):
    model = runtime.models["tiny"]
    budget = 3 * 64 * 64  # three 64x64 images in one call
    runtime.models["tiny"] = replace(model, spec=replace(model.spec, max_pixels_per_job=budget))
    try:
        tenant = f"budget-{uuid.uuid4().hex[:8]}"
        _leader_id, leader_payload = _new_job(db, tenant, seed=1)
        fits, too_big, fits_too = (
            _new_job(db, tenant, seed=2)[0],
            _new_job(db, tenant, seed=3, num_images=2)[0],
            _new_job(db, tenant, seed=5)[0],
        )
        permits = [
            FakePermit(db, job_id, build_payload_of(db, job_id), runtime.owner)
            for job_id in (fits, too_big, fits_too)
        ]
        outcome = execute.execute_job(
            runtime, leader_payload, redelivered=False, open_permits=lambda q: FakeSource(permits)
        )
        if runtime.postprocessor is not None:
            assert runtime.postprocessor.drain(timeout=60)
        assert outcome.verdict == execute.Verdict.HANDED_OVER
        assert [p.settled for p in permits] == [["ack"], ["passed"], ["ack"]]
        with db.session() as session:
            assert session.get(Job, too_big).status == JobStatus.QUEUED
    finally:
        runtime.models["tiny"] = model


def test_a_broker_lost_while_gathering_leaves_the_job_to_run_alone(runtime, db):
    tenant = f"lost-{uuid.uuid4().hex[:8]}"
    leader_id, leader_payload = _new_job(db, tenant, seed=1)
    member_id = _new_job(db, tenant, seed=2)[0]
    member = FakePermit(db, member_id, build_payload_of(db, member_id), runtime.owner)

    class Breaking(FakeSource):
        def fetch(self):
            if self.fetched:
                raise ConnectionResetError("the broker went away")
            return super().fetch()

    source = Breaking([member])
    outcome = execute.execute_job(
        runtime, leader_payload, redelivered=False, open_permits=lambda q: source
    )
    if runtime.postprocessor is not None:
        assert runtime.postprocessor.drain(timeout=60)
    assert outcome.verdict == execute.Verdict.HANDED_OVER and source.closed
    # The member it had claimed is handed back (redelivered: taken over at once).
    assert member.settled == ["requeue"]
    with db.session() as session:
        assert session.get(Job, leader_id).status == JobStatus.SUCCEEDED
        assert session.get(Job, member_id).status == JobStatus.RUNNING


def _publish(db, *job_ids) -> None:
    """As the API's confirmed publish does: fair share counts only published jobs."""
    from app.db.types import utcnow

    with db.session() as session:
        for job_id in job_ids:
            session.get(Job, job_id).published_at = utcnow()


def test_fair_share_picks_a_batchs_members_too(runtime, db):
    """A tenant that used the GPU lately does not fill the batch behind another's job: each
    further message starts the fairest compatible job, as a delivery does."""
    from app.db.types import utcnow

    busy, light = f"busy-{uuid.uuid4().hex[:8]}", f"light-{uuid.uuid4().hex[:8]}"
    spent_id = _new_job(db, busy, seed=100)[0]
    with db.session() as session:  # busy used 100 GPU-seconds a moment ago
        spent = session.get(Job, spent_id)
        spent.status, spent.gpu_seconds, spent.finished_at = JobStatus.SUCCEEDED, 100.0, utcnow()
    busy_jobs = [_new_job(db, busy, seed=i) for i in range(3)]
    light_jobs = [_new_job(db, light, seed=10 + i) for i in range(2)]
    _publish(db, *(j for j, _ in busy_jobs + light_jobs))
    # The first message is busy's oldest job's; the batch's further ones are busy's too.
    permits = [FakePermit(db, job_id, payload, runtime.owner) for job_id, payload in busy_jobs[1:]]
    outcome = execute.execute_job(
        runtime, busy_jobs[0][1], redelivered=False, open_permits=lambda q: FakeSource(permits)
    )
    if runtime.postprocessor is not None:
        assert runtime.postprocessor.drain(timeout=60)
    assert outcome.verdict == execute.Verdict.HANDED_OVER
    with db.session() as session:
        rows = {j: session.get(Job, j) for j, _ in busy_jobs + light_jobs}
        ran = {j for j, row in rows.items() if row.status == JobStatus.SUCCEEDED}
        permits_of = {j: row.permit_id for j, row in rows.items()}
    light_ids = {j for j, _ in light_jobs}
    print(f"ran: light {len(ran & light_ids)}, busy {len(ran - light_ids)}")
    # Both of light's jobs ran in the batch, on busy's messages; busy's oldest took the
    # third place; busy's other two jobs wait, each holding a message (light's two, spare).
    assert light_ids <= ran and len(ran) == 3
    assert all(permits_of[j] is not None for j in light_ids)
    assert [p.settled for p in permits] == [["ack"], ["ack"]]


def test_a_job_with_controls_is_never_gathered_nor_gathers(db):
    """Control images are per row inside a ControlNet call, out of the step callback's
    reach: a job with controls runs in a call of its own (workers/gather.py)."""
    from sqlalchemy import select

    from workers.gather import compatible_sql

    tenant = f"controls-{uuid.uuid4().hex[:8]}"
    control = {"controlnet": "tiny-canny", "image": "c" * 64}
    plain_id, _ = _new_job(db, tenant, seed=1)
    steered_id, _ = _new_job(db, tenant, seed=2, controls=[control])
    other_id, _ = _new_job(db, tenant, seed=3, controls=[{**control, "scale": 0.5}])
    mine = {plain_id, steered_id, other_id}

    def gathered(leader_id) -> set:
        with db.session() as session:
            leader = job_request(session.get(Job, leader_id))
            rows = session.scalars(select(Job.id).where(compatible_sql("tiny", leader)))
            return set(rows) & mine

    assert gathered(plain_id) == {plain_id}  # a plain leader's batch takes plain jobs alone
    assert gathered(steered_id) == set()  # a control job's takes none, not even its like


def test_jobs_of_one_quality_tier_gather_and_of_two_never_share_a_call(db):
    """The tier is a batch field (a step cache or a guidance cut is the whole call's): an
    `exact` job, stored without `quality`, gathers `exact` jobs alone, a `fast` one `fast`
    ones alone (the stored row of an earlier version reads as `exact`)."""
    from sqlalchemy import select

    from workers.gather import compatible_sql

    tenant = f"tiers-{uuid.uuid4().hex[:8]}"
    exact = {_new_job(db, tenant, seed=s)[0] for s in (1, 2)}
    fast = {_new_job(db, tenant, seed=s, quality="fast")[0] for s in (3, 4)}
    mine = exact | fast
    with db.session() as session:
        stored = {j: session.get(Job, j).input for j in mine}
    assert all("quality" not in stored[j] for j in exact)
    assert all(stored[j]["quality"] == "fast" for j in fast)

    def gathered(leader_id) -> set:
        with db.session() as session:
            leader = job_request(session.get(Job, leader_id))
            rows = session.scalars(select(Job.id).where(compatible_sql("tiny", leader)))
            return set(rows) & mine

    assert gathered(next(iter(exact))) == exact
    assert gathered(next(iter(fast))) == fast
