"""The batched delivery: a batching model's claimed job gathers compatible jobs
(workers/gather.py) and runs with them as one pipeline call (workers/run.py), each job
keeping its own message, seed, progress, cancel, lease, deadline and outcome
(docs/batching.md). Each held message is acked, or rejected, only once its own job's
outcome is recorded or handed to post-processing under its lease, exactly as a single
job's message is."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError

from app.db.models.jobs import Job
from app.metrics.instruments import BATCH_SIZE, BATCH_WAIT
from workers import gather, run
from workers.gather import PermitSource
from workers.outcome import Outcome
from workers.pipelines import LoadedModel

if TYPE_CHECKING:
    from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)


def execute_batch(
    rt: WorkerRuntime,
    leader: Job,
    model: LoadedModel,
    open_permits: Callable[[str], PermitSource | None],
) -> Outcome:
    """Run the claimed `leader` with whatever compatible jobs come within max_wait_ms;
    returns the leader's outcome (its message is the task's to settle)."""
    spec = model.spec
    waited_from = time.perf_counter()
    members = [run.Member(leader)]
    try:
        source = open_permits(leader.queue)
    except Exception as exc:  # noqa: BLE001 - the job runs alone rather than not at all
        log.warning("cannot take further messages (%s); running the job alone", exc)
        source = None
    try:
        if source is not None:
            members += [run.Member(job, permit) for permit, job in _gather(rt, leader, source)]
        BATCH_WAIT.labels(spec.name).observe(time.perf_counter() - waited_from)
        BATCH_SIZE.labels(spec.name).observe(len(members))
        log.info(
            "batch of %d job(s) on model %s: %s",
            len(members),
            spec.name,
            ", ".join(str(m.job.id) for m in members),
        )
        run.run(rt, model, members)
    finally:
        # Whatever has no verdict yet (a database outage raised) goes back to the queue.
        for member in members:
            if member.permit is not None and member.outcome is None:
                gather.requeue(member.permit)
        if source is not None:
            source.close()
    outcome = members[0].outcome
    assert outcome is not None
    return outcome


def _gather(rt: WorkerRuntime, leader: Job, source: PermitSource) -> list:
    spec = rt.models[leader.model].spec
    try:
        return gather.collect(
            rt, leader, source, max_batch=spec.max_batch, max_wait=spec.max_wait_ms / 1000
        )
    except DBAPIError:
        raise
    except Exception as exc:  # noqa: BLE001 - the broker went away: the job runs alone
        log.warning("gathering a batch failed (%s); running the job alone", exc)
        return []
