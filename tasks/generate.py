"""The generate task: a thin adapter from a Celery delivery to workers.execute."""

from __future__ import annotations

import logging
import time

from celery import Task
from celery.exceptions import Ignore, Reject, TimeLimitExceeded
from celery.worker import state as worker_state
from celery.worker.request import Request
from sqlalchemy.exc import DBAPIError

from app.broker.payload import GENERATE_TASK
from tasks.boot.gpu import record_hard_timeout, runtime
from tasks.celery_app import app

log = logging.getLogger(__name__)

# A database outage must not turn into a hot redelivery loop.
DATABASE_RETRY_PAUSE = 2.0


class GenerateRequest(Request):
    def on_timeout(self, soft, timeout):
        # A hard time limit kills the pool child; this runs in the worker's main process,
        # which knows the child (so the job fails only while that child's run holds it).
        if not soft and not worker_state.should_terminate and self.args:
            record_hard_timeout(self.args[0], TimeLimitExceeded(timeout), self.worker_pid)
        super().on_timeout(soft, timeout)


class GenerateTask(Task):
    Request = GenerateRequest


# acks_late: the message is acked only once the outcome is recorded. Whether a lost pool
# child's message is requeued comes from celeryconfig (task_reject_on_worker_lost=True);
# the fault suite's control run turns it off to show what it prevents.
@app.task(name=GENERATE_TASK, base=GenerateTask, bind=True, acks_late=True)
def generate(self, payload):
    from workers.execute import Verdict, execute_job

    delivery = self.request.delivery_info or {}
    rt = runtime()
    try:
        # Dynamic batching takes further messages where the broker backend can give them.
        outcome = execute_job(
            rt,
            payload,
            redelivered=bool(delivery.get("redelivered")),
            open_permits=rt.open_permits if rt.broker.features.batching else None,
        )
    except DBAPIError as exc:
        # The outcome could not be recorded: hand the message back instead of acking it.
        log.error("database unavailable (%s); requeueing the message", type(exc).__name__)
        time.sleep(DATABASE_RETRY_PAUSE)
        raise Reject(f"database unavailable: {type(exc).__name__}", requeue=True) from exc
    if outcome.verdict == Verdict.DEAD_LETTER:  # a failed job is a failed task
        raise Reject(outcome.reason, requeue=False)
    if outcome.verdict == Verdict.REQUEUE:
        raise Reject(outcome.reason, requeue=True)
    if outcome.verdict == Verdict.DISCARD:
        # Not a success: the message ran nothing to an outcome (its job was canceled,
        # had finished, or is another worker's). Flower shows it revoked; Ignore acks the
        # message and sends no succeeded event after it.
        self.send_event("task-revoked", terminated=False, signum=None, expired=False)
        raise Ignore(outcome.reason)
    if outcome.verdict == Verdict.HANDED_OVER:
        # Acked, its outcome not known yet: post-processing reports it when recorded
        # (tasks/boot/gpu.py report_outcome), so Flower counts what became of the job.
        raise Ignore(outcome.reason)
    return None
