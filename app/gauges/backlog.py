"""The work queued for each model pool, in GPU-seconds: what GPU workers scale on.

Each queued job counts for what the ETA model (app/jobs/queue_info.py) expects it to
take: the model's fitted fixed cost plus its per-unit cost times the job's work, in the
unit the ETA model is fitted in (one step of one 512 x 512 image): its work units (steps
x images) at the mean size of the jobs counted (read from up to 200 of their inputs).
Jobs that will never reach a GPU are left out: canceled ones (no longer queued), ones
past their `cancel_after` deadline (the relay cancels them on its next pass) and ones
held back by their tenant's cap on running jobs, and those of a paused model
(app/jobs/pauses.py): more GPUs would not start them. A
model that has not finished a job yet is charged FALLBACK_UNIT_SECONDS per unit, so a
fresh pool scales up from zero; its first success replaces the guess.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, or_, select

from app.db.models.jobs import Job
from app.db.session import Database
from app.db.types import utcnow
from app.jobs import pauses
from app.jobs.queue_info import CostModel, cost_model, mean_size
from app.jobs.states import JobStatus

FALLBACK_UNIT_SECONDS = 1.0  # a step of one 512 x 512 image


def backlog_seconds(db: Database) -> dict[str, float]:
    """Estimated GPU-seconds of queued work, by queue (queues with none are absent)."""
    totals: dict[str, float] = defaultdict(float)
    counted = (
        Job.status == JobStatus.QUEUED,
        Job.admitted_at.is_not(None),
        or_(Job.deadline_at.is_(None), Job.deadline_at > utcnow()),
    )
    with db.session() as session:
        paused = list(pauses.paused(session))
        if paused:
            counted = (*counted, Job.model.not_in(paused))
        rows = session.execute(
            select(Job.queue, Job.model, func.count(), func.coalesce(func.sum(Job.work_units), 0))
            .where(*counted)
            .group_by(Job.queue, Job.model)
        ).all()
        for queue, model, count, steps_images in rows:
            cost = cost_model(session, model) or CostModel(0.0, FALLBACK_UNIT_SECONDS)
            # work_units count steps x images; the jobs' own size makes them units.
            units = steps_images * mean_size(
                session, *counted, Job.queue == queue, Job.model == model
            )
            totals[queue] += count * cost.fixed + units * cost.per_unit
    return dict(totals)


def backlog_gauge(db: Database, queues: Iterable[str]) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(
        "diffq_queue_backlog_gpu_seconds",
        "Estimated GPU-seconds of queued work by queue (model pool): queued jobs x the ETA "
        "model's per-job estimate, excluding canceled, expired and cap-held jobs and those "
        "of a paused model",
        labels=["queue"],
    )
    seconds = backlog_seconds(db)
    for queue in sorted(set(queues) | set(seconds)):
        gauge.add_metric([queue], round(seconds.get(queue, 0.0), 3))
    return gauge
