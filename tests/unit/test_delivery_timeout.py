"""Within the broker's delivery timeout: the hand-back margin, the catalog's rule for time
limits past RabbitMQ's consumer_timeout, each delivery's Celery limits, and the step
boundary's decision (hand back, finish, or fail the spent budget) on a clock of its own."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.broker.publish import Publisher
from app.catalog import (
    TIME_LIMIT_HEADROOM_SECONDS,
    Catalog,
    CatalogError,
    ModelSpec,
    hand_back_margin,
    load_catalog,
)
from app.config import load_settings
from workers.checkpoints import BudgetSpent, JobCheckpoints
from workers.outcome import HandBack


@pytest.mark.parametrize(
    ("timeout", "margin"),
    [(7200, 720), (1800, 180), (600, 60), (120, 60), (100, 50), (6, 3), (2, 1)],
)
def test_the_margin_is_a_tenth_of_the_timeout_at_least_60s_and_at_most_half(timeout, margin):
    assert hand_back_margin(timeout) == margin


def test_the_margin_grows_with_the_timeout_and_always_leaves_a_delivery_time():
    timeouts = [0.5, 1, 3, 10, 59, 60, 119, 120, 121, 599, 600, 601, 1800, 7200, 86400]
    margins = [hand_back_margin(t) for t in timeouts]
    assert margins == sorted(margins)
    for timeout, margin in zip(timeouts, margins, strict=True):
        assert 0 < margin <= timeout / 2
        assert margin >= min(60, timeout / 2)
        assert margin >= timeout / 10


def _spec(**limits) -> ModelSpec:
    return ModelSpec(name="m", path=Path("/m"), queue="gpu.m", **limits)


def _load(tmp_path, table: str, timeout: int | None = None):
    path = tmp_path / "models.toml"
    path.write_text(f'[models.m]\npath = "/m"\n{table}\n')
    env = {"DIFFQ_HOME": str(tmp_path), "DIFFQ_MODELS_FILE": str(path)}
    if timeout is not None:
        env["DIFFQ_BROKER_CONSUMER_TIMEOUT"] = str(timeout)
    return load_catalog(load_settings(env))


def test_a_model_that_checkpoints_may_run_past_the_consumer_timeout(tmp_path):
    catalog = _load(tmp_path, "soft_time_limit = 7000\ntime_limit = 7200\ncheckpoint_seconds = 30")
    spec = catalog.models["m"]
    assert spec.spans_deliveries and spec.time_limit == 7200
    # The fault suite's broker: a timeout of seconds, every model one that checkpoints.
    assert _load(tmp_path, "checkpoint_seconds = 0.2", timeout=6).models["m"].spans_deliveries


@pytest.mark.parametrize(
    "why", ["checkpoint_seconds = 0", "max_batch = 4", "checkpoint_seconds = 0\nmax_batch = 4"]
)
def test_a_model_whose_jobs_cannot_span_deliveries_is_still_refused(tmp_path, why):
    limit = 1800 - TIME_LIMIT_HEADROOM_SECONDS + 1
    table = f"soft_time_limit = 1000\ntime_limit = {limit}\n{why}"
    with pytest.raises(CatalogError, match="consumer_timeout") as refused:
        _load(tmp_path, table)
    assert "DIFFQ_BROKER_CONSUMER_TIMEOUT" in str(refused.value)
    assert f"time_limit {limit}s" in str(refused.value)
    assert not _spec(soft_time_limit=1000, time_limit=1500, max_batch=4).spans_deliveries
    _load(tmp_path, table.replace(f"time_limit = {limit}", "time_limit = 1500"))  # fits


def test_each_delivery_of_a_model_that_spans_them_ends_inside_the_consumer_timeout():
    spec = _spec(soft_time_limit=7000, time_limit=7200)
    assert spec.delivery_limits(1800) == (1710, 1755)  # margin 180: after the hand-back
    for timeout in (4, 6, 60, 600, 1800, 7200):
        soft, hard = spec.delivery_limits(timeout)
        hand_back = timeout - hand_back_margin(timeout)
        assert hand_back < soft < hard < timeout, timeout
    # Limits already inside are the model's own; a model that cannot span keeps its own.
    assert _spec(soft_time_limit=120, time_limit=180).delivery_limits(1800) == (120, 180)
    own = _spec(soft_time_limit=600, time_limit=660, checkpoint_seconds=0)
    assert own.delivery_limits(1800) == (600, 660)


def test_the_message_carries_the_deliverys_limits_not_the_budget():
    long = _spec(soft_time_limit=7000, time_limit=7200)
    plain = replace(long, name="p", soft_time_limit=600, time_limit=660, checkpoint_seconds=0)
    catalog = Catalog(models={"m": long, "p": plain}, default_model="m")
    broker = SimpleNamespace(settings=SimpleNamespace(broker_consumer_timeout=1800))
    publisher = Publisher(catalog, broker=broker, celery_app=None)
    job = SimpleNamespace(id=uuid.uuid4(), model="m", publish_priority=5)
    options = publisher._job_options(job, None)
    assert (options["soft_time_limit"], options["time_limit"]) == (1710, 1755)
    options = publisher._job_options(SimpleNamespace(**(vars(job) | {"model": "p"})), None)
    assert (options["soft_time_limit"], options["time_limit"]) == (600, 660)


class Runtime:
    """What a job's checkpoints ask of the worker runtime, on a clock the test moves."""

    def __init__(self, timeout: int, clock) -> None:
        self.settings = SimpleNamespace(broker_consumer_timeout=timeout, shutdown_finish=10.0)
        self.name = "gpu0@test"
        self.clock = clock
        self.delivery_started = clock()
        self.draining = False
        self.yielded: dict[uuid.UUID, HandBack] = {}

    def delivery_seconds(self) -> float:
        return self.clock() - self.delivery_started

    def leaving(self, job_id) -> bool:
        return self.draining or job_id in self.yielded

    def yield_job(self, job_id, reason=HandBack.YIELD) -> None:
        self.yielded.setdefault(job_id, HandBack(reason))

    def hand_back_reason(self, job_id):
        return self.yielded.get(job_id)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _checkpoints(spec: ModelSpec, timeout: int, spent: float = 0.0):
    clock = Clock()
    rt = Runtime(timeout, clock)
    job = SimpleNamespace(
        id=uuid.uuid4(),
        tenant_id=uuid.uuid4(),
        checkpoint_step=None,
        spent_seconds=spent,
        input={
            "kind": "txt2vid",
            "prompt": "p",
            "scheduler": "default",
            "model": "m",
            "width": 64,
            "height": 64,
            "steps": 1000,
            "guidance_scale": 1.0,
            "seed": 1,
            "num_frames": 9,
            "fps": 8,
        },
    )
    model = SimpleNamespace(spec=spec, manifest={"model_sha256": "0" * 64})
    return JobCheckpoints(rt, job, model, clock=clock), rt, clock, job


def _steps_until_leaving(checkpoints, clock, *, seconds_a_step: float, total: int = 1000):
    for step in range(1, total + 1):
        clock.now += seconds_a_step
        if checkpoints.leaving(step, total):
            return step
    return None


def test_a_delivery_hands_its_job_back_before_its_next_step_would_pass_the_margin():
    spec = _spec(soft_time_limit=7000, time_limit=7200, checkpoint_seconds=30)
    checkpoints, rt, clock, job = _checkpoints(spec, timeout=1800)
    left_at = _steps_until_leaving(checkpoints, clock, seconds_a_step=7.0)
    ran = rt.delivery_seconds()
    # 1620 s is where the margin begins: the step that would pass it is not run.
    assert left_at == 231 and ran == 231 * 7.0
    assert ran + 7.0 >= 1620 > ran
    assert rt.yielded == {job.id: HandBack.CONSUMER_TIMEOUT}
    # A step's pace counts from the resumed step: the skipped steps cost nothing.
    checkpoints, rt, clock, _ = _checkpoints(spec, timeout=1800)
    for step in range(1, 500):
        clock.now += 0.001
        assert not checkpoints.leaving(step, 1000)
    checkpoints.resumed(500)
    step = 500
    while not checkpoints.leaving(step, 1000):
        step += 1
        clock.now += 100.0
    assert step == 516 and 1520 <= rt.delivery_seconds() < 1620


def test_the_last_step_is_never_a_reason_to_leave_and_a_short_delivery_stays():
    spec = _spec(soft_time_limit=7000, time_limit=7200, checkpoint_seconds=30)
    checkpoints, rt, clock, _ = _checkpoints(spec, timeout=1800)
    assert _steps_until_leaving(checkpoints, clock, seconds_a_step=1.0, total=1500) is None
    assert rt.yielded == {}
    checkpoints, rt, clock, _ = _checkpoints(spec, timeout=1800)
    clock.now += 5000  # past the margin, but the job is at its last step
    assert not checkpoints.leaving(10, 10)


def test_a_spent_budget_ends_the_job_at_its_next_step():
    spec = _spec(soft_time_limit=3000, time_limit=3300, checkpoint_seconds=30)
    checkpoints, rt, clock, _ = _checkpoints(spec, timeout=1800, spent=2900.0)
    clock.now += 50
    assert not checkpoints.leaving(1, 100)
    clock.now += 50  # 2900 + 100 s
    with pytest.raises(BudgetSpent):
        checkpoints.leaving(2, 100)
    assert rt.yielded == {}  # failed, not handed back


def test_a_drain_still_lets_a_job_near_its_end_finish():
    spec = _spec(soft_time_limit=7000, time_limit=7200, checkpoint_seconds=30)
    checkpoints, rt, clock, _ = _checkpoints(spec, timeout=1800)
    rt.draining = True
    assert not _steps_until_leaving(checkpoints, clock, seconds_a_step=1.0, total=5)
    checkpoints, rt, clock, _ = _checkpoints(spec, timeout=1800)
    rt.draining = True
    assert _steps_until_leaving(checkpoints, clock, seconds_a_step=1.0, total=50) == 2
    assert rt.yielded == {}  # the shutdown's reason, not the delivery's
