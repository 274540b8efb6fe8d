"""A single job's checkpoints: its denoising state stored at step boundaries, so that a
run that dies (a killed worker, a lost node, a spot notice, a hand-back) resumes where the
last one stopped on any worker that serves its model, not at step 0 (docs/reliability.md).

- **When**: every `checkpoint_seconds` of denoising (the model's, in the catalog; 0 turns
  it off), so a job shorter than that writes none and loses less than that if it dies;
  and at once when the job is handed back (a shutdown, a spot notice: the worker's
  SIGTERM), before its message goes back to the queue.
- **Where**: the result store, `<tenant>/<job>/checkpoint.pt` (one object, overwritten),
  with `jobs.checkpoint_step` saying a stored one exists. Periodic saves upload on a
  thread of their own (the GPU goes on; a save still uploading makes the next one wait for
  its turn by being skipped); the hand-back's save is waited for.
- **Resume**: a claimed job whose row names a checkpoint reads it. It must be this job's,
  on the model's digest, from this diffq version, of the same kind and scheduler; anything
  else (missing, truncated, another model or version, a layout it does not know, a state
  that does not fit the call) starts the job afresh and says why in its manifest.
- **Gone** when the job succeeds (after its outcome is recorded); the checkpoint of a job
  that ended otherwise (failed, canceled, or finished by another run) is removed by the
  relay's retention pass (app/housekeeping/retention.py), and an upload that ends after
  its run lost the job removes what it wrote unless the row names a checkpoint.
- **Within the broker's delivery timeout**: at each step boundary, a delivery that would
  pass `consumer_timeout - hand_back_margin` by its next step (app/catalog.py) hands the
  job back as a shutdown does; the next delivery resumes it. The model's soft_time_limit
  is a budget across deliveries (`jobs.spent_seconds`): a step that finds it spent fails
  the job with `timeout` (`BudgetSpent`).

The manifest lists every resume: the step it resumed from, the worker, and why the run
before it went back to the queue, where it handed the job back as it stored its state.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from celery.exceptions import SoftTimeLimitExceeded

from app.catalog import hand_back_margin
from app.jobs import transitions
from app.kinds import job_request
from app.storage import StorageError, checkpoint_key
from app.storage.retry import get_with_retry, put_with_retry
from workers import denoise_state
from workers.denoise_state import DenoiseState, StateError
from workers.manifest import package_version
from workers.outcome import HandBack

if TYPE_CHECKING:
    from app.db.models.jobs import Job
    from workers.pipelines import LoadedModel
    from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)


class BudgetSpent(SoftTimeLimitExceeded):
    """The job's running seconds over all its deliveries reached its soft_time_limit: it
    ends as a Celery soft limit ends it (workers/run.py), failed with `timeout`."""


def open_checkpoints(rt: WorkerRuntime, job: Job, model: LoadedModel) -> JobCheckpoints | None:
    """A job running alone: its checkpoints, the stored one read; None where its model
    keeps none (`checkpoint_seconds = 0`)."""
    import diffusers

    if model.spec.checkpoint_seconds <= 0:
        return None
    if not isinstance(model.pipeline, diffusers.DiffusionPipeline):
        return None  # a stand-in (workers/synthetic.py) carries no state to save
    checkpoints = JobCheckpoints(rt, job, model)
    checkpoints.load()
    return checkpoints


def with_leaving(
    on_step: Callable[[int, int], bool], checkpoints: JobCheckpoints | None
) -> Callable[[int, int], bool]:
    """A job's step callback (its progress: False once it is no longer held) that, for a
    checkpointed job, also says False when a shutdown sends it back now (`leaving`)."""
    if checkpoints is None:
        return on_step
    return lambda step, total: on_step(step, total) and not checkpoints.leaving(step, total)


class JobCheckpoints:
    """One job's checkpoints on one worker (workers/call.py `Checkpointing`)."""

    def __init__(
        self,
        rt: WorkerRuntime,
        job: Job,
        model: LoadedModel,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        request = job_request(job)
        self._rt = rt
        self._job_id = job.id
        self.key = checkpoint_key(job.tenant_id, job.id)
        self.interval = model.spec.checkpoint_seconds
        self.meta = {
            "job": str(job.id),
            "model_sha256": (model.manifest or {}).get("model_sha256"),
            "diffq": package_version("diffq"),
            "kind": request.kind,
            "scheduler": request.scheduler,
        }
        self.resume: DenoiseState | None = None
        self.history: list[dict[str, Any]] = []  # earlier runs' resumes
        self.note: str | None = None  # why a checkpoint was not resumed
        self.stored_step: int | None = job.checkpoint_step
        self.saves = 0
        # Why the run that stored the resumed state left, where it said (a hand-back).
        self.left: str | None = None
        # A delivery hands the job back before it would pass this many seconds; the
        # model's soft_time_limit is a budget over every delivery (None: within one).
        timeout = rt.settings.broker_consumer_timeout
        self.hand_back_after = timeout - hand_back_margin(timeout)
        spec = model.spec
        self.budget = spec.soft_time_limit if spec.spans_deliveries else None
        self.spent = job.spent_seconds or 0.0  # by its earlier deliveries
        self._clock = clock
        self._last = self._started = clock()
        self._first_step: int | None = None  # the first step this run computed
        self._upload: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- resume ------------------------------------------------------------------------

    def load(self) -> None:
        """Read the job's checkpoint, if its row names one; `resume` is then set, or
        `note` says why not."""
        if self.stored_step is None:
            return
        settings = self._rt.settings
        try:
            blob = get_with_retry(
                self._rt.storage,
                self.key,
                retries=settings.upload_retries,
                backoff=settings.upload_backoff,
                backoff_max=settings.upload_backoff_max,
            )
            state = denoise_state.loads(blob)
            self._check(state.meta)
        except (StorageError, StateError) as exc:
            self.refused(_reason(exc))
            return
        self.resume = state
        self.history = list(state.meta.get("history") or [])
        self.left = state.meta.get("left")

    def _check(self, meta: dict[str, Any]) -> None:
        for name in ("job", "model_sha256", "diffq", "kind", "scheduler"):
            if meta.get(name) != self.meta[name]:
                raise StateError(f"its {name} is {meta.get(name)!r}, not {self.meta[name]!r}")

    def refused(self, reason: str) -> None:
        step = self.resume.step if self.resume is not None else self.stored_step
        self.note = f"the checkpoint at step {step} was not resumed ({reason}): started afresh"
        log.warning("job %s: %s", self._job_id, self.note, extra={"job_id": str(self._job_id)})
        self.resume = None

    def resumed(self, step: int) -> None:
        """The call resumed at `step`: an entry in the history (the manifest's, and every
        later checkpoint's)."""
        self._first_step, self._started = step, self._clock()  # its pace from here
        entry = {
            "from_step": step,
            "worker": self._rt.name,
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        if self.left:  # why the run before went back (absent: it was lost)
            entry["reason"] = self.left
        self.history.append(entry)

    # -- leaving -----------------------------------------------------------------------

    def leaving(self, step: int, total: int) -> bool:
        """Whether the job leaves now, at this step boundary:
        - its delivery would pass `hand_back_after` seconds by its next step at this
          run's pace: it goes back before the broker's consumer_timeout, however near
          its end (its last steps, decode and upload need time the margin keeps for the
          hand-back);
        - a shutdown began (the worker's SIGTERM: a deploy, a spot notice), or it was
          asked to yield (its model paused `now`, an urgent job waits): it does when more
          than DIFFQ_SHUTDOWN_FINISH seconds of steps are left at this run's pace; closer
          to its end, it finishes.
        Raises BudgetSpent once its running seconds over all deliveries reach its
        model's soft_time_limit."""
        if self._first_step is None:
            self._first_step = step
            self._started = self._clock()
        if step >= total:
            return False
        pace = (self._clock() - self._started) / max(1, step - self._first_step)
        if self._delivery_ends(pace):
            return True
        if not self._rt.leaving(self._job_id):
            return False
        return pace * (total - step) > self._rt.settings.shutdown_finish

    def _delivery_ends(self, pace: float) -> bool:
        ran = self._rt.delivery_seconds()
        if self.budget is not None and self.spent + ran >= self.budget:
            raise BudgetSpent(f"{self.spent + ran:.1f}s of running over its deliveries")
        if ran + pace < self.hand_back_after:
            return False
        self._rt.yield_job(self._job_id, HandBack.CONSUMER_TIMEOUT)
        return True

    # -- save --------------------------------------------------------------------------

    def due(self, step: int, total: int) -> bool:
        return self.interval > 0 and self._clock() - self._last >= self.interval

    def save(self, state: DenoiseState, *, leaving: bool) -> None:
        if leaving and not self._rt.handing_back(self._job_id):
            return  # canceled, or taken over by another run: nothing resumes from here
        self._last = self._clock()
        state.meta = {**self.meta, "history": list(self.history)}
        if leaving:  # handed back: stored before the message goes back
            state.meta["left"] = str(self._rt.hand_back_reason(self._job_id))
            self.wait()
            self._write(state)
            return
        with self._lock:
            if self._upload is not None and self._upload.is_alive():
                return  # the last one is still uploading: this one waits for the next turn
            self._upload = threading.Thread(
                target=self._write, args=(state,), name="checkpoint-upload", daemon=True
            )
            self._upload.start()

    def wait(self) -> None:
        with self._lock:
            upload = self._upload
        if upload is not None:
            upload.join()

    def _write(self, state: DenoiseState) -> None:
        settings = self._rt.settings
        started = time.perf_counter()
        try:
            blob = denoise_state.dumps(state)
            put_with_retry(
                self._rt.storage,
                self.key,
                blob,
                "application/octet-stream",
                retries=settings.upload_retries,
                backoff=settings.upload_backoff,
                backoff_max=settings.upload_backoff_max,
            )
            with self._rt.db.session() as session:
                held = transitions.record_checkpoint(
                    session, self._job_id, owner=self._rt.owner, step=state.step
                )
        except Exception:
            log.exception("job %s: checkpoint at step %s not stored", self._job_id, state.step)
            return
        if not held:
            self._forget_unnamed()
            return
        self.stored_step = state.step
        self.saves += 1
        log.info(
            "job %s: checkpoint at step %s/%s stored (%d bytes, %.0f ms)",
            self._job_id,
            state.step,
            state.total,
            len(blob),
            (time.perf_counter() - started) * 1000,
            extra={"job_id": str(self._job_id)},
        )

    def _forget_unnamed(self) -> None:
        """An upload that ended after this run lost the job (it finished, or another run
        took it over): unless the row names a checkpoint (the other run's: it overwrites
        this one and removes it at its end), nothing would ever remove it: now."""
        from app.db.models.jobs import Job

        with contextlib.suppress(Exception), self._rt.db.session() as session:
            job = session.get(Job, self._job_id)
            if job is None or job.status.terminal or job.checkpoint_step is None:
                self._rt.storage.delete(self.key)

    # -- end ---------------------------------------------------------------------------

    def discard(self) -> None:
        """The job ended here: its checkpoint goes (best effort: retention removes one
        left behind)."""
        self.wait()
        if self.stored_step is None and self.saves == 0:
            return
        with contextlib.suppress(Exception):
            self._rt.storage.delete(self.key)
            with self._rt.db.session() as session:
                transitions.forget_checkpoint(session, self._job_id)
            self.stored_step = None

    def manifest(self) -> dict[str, Any]:
        """What the result's manifest says of resumes."""
        out: dict[str, Any] = {}
        if self.history:
            out["resumes"] = list(self.history)
        if self.note:
            out["resume_note"] = self.note
        return out


def _reason(exc: Exception) -> str:
    if isinstance(exc, StorageError) and not exc.transient:
        return "it is missing from the store"
    return str(exc)
