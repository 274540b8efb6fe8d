"""Running claimed jobs on a loaded model: one pipeline call for all of them (a single job
is a batch of one), each job with its own stop flag, progress, lease and outcome.

Every job of a run gets a verdict in `Member.outcome`, and, where it came on a message of
its own (a batch's further jobs), that message is settled at once. A failed call of
several jobs runs each of them again alone, so one job's bad input never fails another.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.exc import DataError, DBAPIError

from app.addons import ADDONS
from app.addons.base import AddonMissing
from app.db.models.jobs import Job
from app.jobs.states import ErrorCode
from app.kinds import JobRequest, job_request
from app.logs import job_context
from app.metrics.instruments import WORKER_BUSY
from app.storage import StorageUnavailable
from workers import call, record
from workers.checkpoints import JobCheckpoints, open_checkpoints, with_leaving
from workers.inputs import InputMissing, load_inputs
from workers.lease import LeaseKeeper
from workers.oom import free_accelerator_memory, is_out_of_memory
from workers.outcome import Outcome, Permit, Verdict, settle
from workers.pipelines import LoadedModel
from workers.progress import ProgressReporter
from workers.store import store

if TYPE_CHECKING:
    from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)


@dataclass
class Member:
    """A claimed job in a run."""

    job: Job
    permit: Permit | None = None  # None: the delivery's own message, the task's to settle
    request: JobRequest = field(init=False)
    stop: threading.Event = field(default_factory=threading.Event)
    reporter: ProgressReporter = field(init=False)
    renew: Callable[[], bool] = field(init=False)
    lease: LeaseKeeper | None = None
    outcome: Outcome | None = None
    inputs: dict[str, Any] = field(default_factory=dict)  # its input images, loaded
    # What each of its add-ons fetched, by the add-on's field (app/addons: its adapters'
    # tensors by digest, its ControlNets by name).
    addons: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoints: JobCheckpoints | None = None  # a job running alone, where its model saves them

    def __post_init__(self) -> None:
        self.request = job_request(self.job)  # read from the row once


def decide(member: Member, outcome: Outcome) -> None:
    """Record a member's verdict and settle its message now (the leader's: the task's)."""
    member.outcome = outcome
    if member.permit is not None:
        settle(member.permit, outcome)


def run(rt: WorkerRuntime, model: LoadedModel, members: list[Member]) -> None:
    """Run the members as one pipeline call; every member ends with an outcome."""
    held_since = time.perf_counter()
    for member in members:
        _start(rt, member)
    try:
        _generate(rt, model, members)
    finally:
        for member in members:
            if member.lease is not None:
                member.lease.close()
            member.reporter.close()
            rt.release(member.job.id)
        WORKER_BUSY.labels(rt.name).inc(time.perf_counter() - held_since)


def _start(rt: WorkerRuntime, member: Member) -> None:
    member.stop = rt.hold(member.job.id)
    write, member.renew = record.job_writes(rt, member.job.id)
    member.reporter = ProgressReporter(
        write, interval=rt.settings.progress_interval, stop=member.stop
    )
    member.lease = LeaseKeeper(
        member.renew, interval=rt.settings.lease_seconds / 3, stop=member.stop
    ).start()


def _loaded(rt: WorkerRuntime, model: LoadedModel, member: Member) -> bool:
    """Read the member's input images and what its add-ons need; a job whose inputs
    cannot be read fails here."""
    job = member.job
    try:
        member.inputs = load_inputs(rt, job.tenant_id, member.request)
        member.addons = {
            name: addon.worker_half().fetch(rt, model, job.tenant_id, getattr(member.request, name))
            for name, addon in ADDONS.items()
        }
    except InputMissing as exc:
        decide(member, record.fail(rt, job, ErrorCode.INVALID_INPUT, str(exc)))
    except AddonMissing as exc:
        decide(member, record.fail(rt, job, ErrorCode(exc.code), str(exc)))
    except StorageUnavailable as exc:
        decide(member, record.fail(rt, job, ErrorCode.STORAGE_UNAVAILABLE, str(exc)))
    return member.outcome is None


def _generate(rt: WorkerRuntime, model: LoadedModel, members: list[Member]) -> None:
    started = time.perf_counter()
    running: list[Member] = []
    for member in members:
        steps = member.request.denoise_steps
        if not member.reporter.begin("encoding_prompt", 0, steps):
            decide(member, Outcome(Verdict.DISCARD, "job no longer held before generation"))
        elif _loaded(rt, model, member):
            running.append(member)
    if not running:
        return
    out_of_memory = False
    if len(running) == 1:
        running[0].checkpoints = open_checkpoints(rt, running[0].job, model)
    pipeline_started = time.perf_counter()
    try:
        outputs = call.generate(
            model,
            [m.request for m in running],
            on_step=[with_leaving(m.reporter.step, m.checkpoints) for m in running],
            inputs=[m.inputs for m in running],
            addons={
                name: {k: v for m in running for k, v in m.addons[name].items()} for name in ADDONS
            },
            checkpoints=running[0].checkpoints,
        )
        for name, addon in ADDONS.items():  # LoRA's: a set this worker now holds
            addon.worker_half().ran(rt, getattr(running[0].request, name))
    except call.Interrupted:
        outputs = [None] * len(running)
    except SoftTimeLimitExceeded:  # Celery's for this delivery, or its budget's
        for member in running:
            step = member.reporter.last_step
            decide(member, record.over_time(rt, member.job, model.spec, step))
        return
    except Exception as exc:
        if isinstance(exc, DBAPIError) and not isinstance(exc, DataError):
            raise
        if len(running) > 1:
            log.warning(
                "batch of %d failed (%s: %s); running its jobs one at a time",
                len(running),
                type(exc).__name__,
                (str(exc).splitlines() or [""])[0][:200],
            )
            outputs = None
        elif not is_out_of_memory(exc):
            decide(running[0], record.crashed(rt, running[0].job, exc))
            return
        else:
            first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
            log.warning("job %s ran out of memory: %s", running[0].job.id, first_line[:200])
            out_of_memory = True
            outputs = None
    if outputs is None:
        # Only here, once the except clause has dropped the traceback (whose frames pin
        # the activations), can the memory go back: freeing it inside the clause would
        # keep the peak allocated and fail the next job too.
        free_accelerator_memory()
        if out_of_memory:  # gpu_oom is dead-lettered, never retried with these parameters
            advice = "out of memory; retry with a smaller size or batch"
            decide(running[0], record.fail(rt, running[0].job, ErrorCode.GPU_OOM, advice))
            return
        for member in running:  # each alone: one job's failure is not the others'
            _generate(rt, model, [member])
        return
    generated = time.perf_counter()
    images = sum(len(o.images) for o in outputs if o is not None) or 1
    for member, output in zip(running, outputs, strict=True):
        with job_context(job_id=str(member.job.id), tenant=str(member.job.tenant_id)):
            if output is None:
                decide(member, record.stopped(rt, member.job, member.reporter.last_step))
                continue
            share = (generated - pipeline_started) * len(output.images) / images
            try:
                outcome = store(rt, member, model, output, (started, generated), share)
            except Exception as exc:  # noqa: BLE001 - recorded in crashed
                outcome = record.crashed(rt, member.job, exc)
            decide(member, outcome)
