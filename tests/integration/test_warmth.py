"""Warmth in the fair choice, against PostgreSQL: a worker holding a job's adapters
(loaded in its model's pipeline before merely in memory) starts it before a cold fair
choice, at most DIFFQ_WARM_MAX_SKIPS times for that job,
only for a tenant within the share slack, and never across priorities."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import update

from app.addons.lora import Lora
from app.db.models.jobs import Job
from app.db.models.tenants import Tenant
from app.db.types import utcnow
from app.jobs import fairness, service
from app.jobs.states import JobStatus, Priority
from testbed.factories import job_request

pytestmark = pytest.mark.services

WINDOW = 600.0
WARM_LORA = (Lora("a" * 64, 1.0),)
COLD_LORA = (Lora("b" * 64, 1.0),)
LOADED_LORA = (Lora("c" * 64, 1.0),)


def _tenant(session, prefix: str) -> Tenant:
    tenant = Tenant(name=f"{prefix}-{uuid.uuid4().hex[:10]}", weight=1.0)
    session.add(tenant)
    session.flush()
    return tenant


def _queued(session, tenant, queue, loras=(), priority=Priority.NORMAL, model="tiny") -> Job:
    job = service.create_job(
        session,
        tenant.id,
        model=model,
        queue=queue,
        priority=priority,
        request=job_request(model="tiny", steps=2, loras=loras),
        metadata=None,
    )
    job.published_at = utcnow()
    session.flush()
    return job


def _used(session, tenant, queue, seconds: float) -> None:
    job = _queued(session, tenant, queue)
    session.execute(
        update(Job)
        .where(Job.id == job.id)
        .values(status=JobStatus.SUCCEEDED, finished_at=utcnow(), gpu_seconds=seconds)
    )


def _set(loras) -> str:
    return job_request(model="tiny", loras=loras).adapter_set


def _warmth(max_skips=2, slack=60.0, models=("tiny",)) -> fairness.Warmth:
    """Held warm: WARM_LORA in memory, LOADED_LORA in memory and in tiny's pipeline."""
    memory = ("", _set(WARM_LORA), _set(LOADED_LORA))
    loaded = (("tiny", ""), ("tiny", _set(LOADED_LORA)))
    return fairness.Warmth(models, memory, max_skips, slack, loaded)


def _start(session, queue, warmth) -> Job:
    """What the next message starts, started (as a claim would)."""
    chosen = fairness.fairest(session, queue, Priority.NORMAL.amqp, utcnow(), WINDOW, warmth=warmth)
    session.execute(update(Job).where(Job.id == chosen.id).values(status=JobStatus.RUNNING))
    session.flush()
    return chosen


def test_a_warm_job_goes_first_but_the_cold_fair_choice_is_passed_over_at_most_max_skips(db):
    queue = f"gpu.warm-{uuid.uuid4().hex[:8]}"
    with db.session() as session:
        rare, busy = _tenant(session, "rare"), _tenant(session, "busy")
        _used(session, busy, queue, 5.0)  # busy is ahead by 5 s: rare is the fair choice
        cold = _queued(session, rare, queue, loras=COLD_LORA)
        warm = [_queued(session, busy, queue, loras=WARM_LORA) for _ in range(4)]
        # Warmth ignored: the fair choice, cold or not.
        assert (
            fairness.fairest(session, queue, Priority.NORMAL.amqp, utcnow(), WINDOW).id == cold.id
        )
        started = [_start(session, queue, _warmth(max_skips=2)).id for _ in range(3)]
        assert started == [warm[0].id, warm[1].id, cold.id]  # two skips, then the cold job
        session.refresh(cold)
        assert cold.warm_skips == 2
        session.rollback()


def test_warmth_does_not_bend_fair_share_past_the_slack(db):
    queue = f"gpu.warm-{uuid.uuid4().hex[:8]}"
    with db.session() as session:
        rare, busy = _tenant(session, "rare"), _tenant(session, "busy")
        _used(session, busy, queue, 120.0)  # 120 s ahead, past a 60 s slack
        cold = _queued(session, rare, queue, loras=COLD_LORA)
        _queued(session, busy, queue, loras=WARM_LORA)
        assert _start(session, queue, _warmth(slack=60.0)).id == cold.id
        session.rollback()


def test_a_warm_fair_choice_and_other_priorities_are_left_alone(db):
    queue = f"gpu.warm-{uuid.uuid4().hex[:8]}"
    with db.session() as session:
        first, second = _tenant(session, "first"), _tenant(session, "second")
        plain = _queued(session, first, queue)  # no adapters: warm everywhere
        _queued(session, second, queue, loras=WARM_LORA)
        high_warm = _queued(session, second, queue, loras=WARM_LORA, priority=Priority.HIGH)
        chosen = _start(session, queue, _warmth())
        assert chosen.id == plain.id  # the fair choice is warm: nothing to bend
        assert chosen.id != high_warm.id
        session.refresh(plain)
        assert plain.warm_skips == 0
        session.rollback()


def test_with_no_job_fully_warm_a_job_of_a_loaded_model_goes_before_a_cold_model(db):
    queue = f"gpu.warm-{uuid.uuid4().hex[:8]}"
    with db.session() as session:
        rare, busy = _tenant(session, "rare"), _tenant(session, "busy")
        _used(session, busy, queue, 5.0)
        cold_model = _queued(session, rare, queue, model="other")
        loaded_model = _queued(session, busy, queue, loras=COLD_LORA)  # its adapter is cold
        assert _start(session, queue, _warmth()).id == loaded_model.id
        assert _start(session, queue, _warmth()).id == cold_model.id  # nothing warm is left
        session.rollback()


def test_adapters_loaded_in_the_pipeline_go_before_adapters_only_in_memory(db):
    queue = f"gpu.warm-{uuid.uuid4().hex[:8]}"
    with db.session() as session:
        rare, busy = _tenant(session, "rare"), _tenant(session, "busy")
        _used(session, busy, queue, 5.0)  # rare is the fair choice
        cold = _queued(session, rare, queue, loras=COLD_LORA)
        in_memory = _queued(session, busy, queue, loras=WARM_LORA)  # older
        in_pipeline = _queued(session, busy, queue, loras=LOADED_LORA)
        started = [_start(session, queue, _warmth(max_skips=2)).id for _ in range(3)]
        assert started == [in_pipeline.id, in_memory.id, cold.id]
        session.rollback()
