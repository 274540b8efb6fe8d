"""The GPU worker's root: what its pool process holds for its whole life (settings,
database, store, broker, the loaded models) and the jobs it runs now, each with the flag
that stops it at its next step."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping

from sqlalchemy.exc import SQLAlchemyError

from app.addons.lora.worker import AdapterMemory
from app.catalog import Catalog
from app.jobs import residency
from app.jobs.cache import record_model_digest
from app.jobs.fairness import Warmth
from app.jobs.listener import Listener
from app.jobs.notify import CANCEL_CHANNEL
from app.jobs.transitions import YIELD_PREFIX
from app.services import Services
from workers import conditioning
from workers.compiled import use_compile_cache
from workers.devices import configure_cpu_threads, select_device
from workers.footprint import device_budget, estimate_bytes
from workers.models import ModelCache
from workers.outcome import HandBack
from workers.pipelines import LoadedModel, load_model, model_identity, resolve_dtype, warm_up
from workers.postprocess import PostProcessor
from workers.record import record
from workers.unload import DEMAND_WINDOW, Demand

log = logging.getLogger(__name__)


class WorkerRuntime(Services):
    """A GPU worker pool process's root (app/services.py's, plus its models)."""

    def __init__(
        self,
        settings,
        *,
        models: Mapping[str, LoadedModel],
        device: str,
        owner: str,
        name: str,
        postprocessor: PostProcessor | None = None,
        **root_options,
    ) -> None:
        super().__init__(settings, **root_options)
        # The loaded models (workers/models.py); models handed over loaded are held as such.
        self.models = models if isinstance(models, ModelCache) else ModelCache.holding(models)
        self.device = device
        self.owner = owner
        self.name = name  # the Celery node name (gpu0@host): a label on this worker's metrics
        # Encodes, uploads and records finished jobs while the GPU runs the next (None: inline).
        self.postprocessor = postprocessor
        # Set by a shutdown: a stopped job goes back to the queue instead of being dropped.
        self.hand_back_requested = threading.Event()
        # Set when a shutdown begins (a deploy, a spot notice): a job that checkpoints and
        # has more than DIFFQ_SHUTDOWN_FINISH seconds left saves its state and goes back
        # to the queue at its next step; the others finish within the grace.
        self.draining = threading.Event()
        # The jobs running now (one, or a batch's), each with its stop flag: raised by a
        # cancel notification, a lost lease, or a shutdown that outlasts its grace.
        self._running: dict[uuid.UUID, threading.Event] = {}
        # Running jobs asked to checkpoint and go back to the queue at their next step
        # (their model paused `now`: app/jobs/pauses.py; an urgent job waits; their
        # delivery nears the broker's consumer_timeout), as a shutdown's drain does; why.
        self._yielding: dict[uuid.UUID, HandBack] = {}
        # When the delivery being run began (time.monotonic(), set by workers/execute.py):
        # the broker's consumer_timeout and the Celery time limits count from it.
        self.delivery_started = time.monotonic()
        # LoRA adapters held in CPU memory (app/addons/lora/worker.py); each model's pipeline
        # keeps its own loaded ones.
        self.adapter_memory = AdapterMemory(settings.adapter_cache_bytes)
        for model in models.values():  # in order: the least recent stays least recent
            _size_adapters(model, settings)
        # Cancel notifications (PostgreSQL's LISTEN), started by build_runtime.
        self.cancel_listener: Listener | None = None
        self._closing = threading.Event()  # stops the held models' renewal

    def close(self) -> None:
        if self.cancel_listener is not None:
            self.cancel_listener.stop()
        if self.opened("db"):
            self.hold_nothing()
        super().close()

    def hold_nothing(self) -> None:
        """At the end: the other workers hold nothing for this one any more."""
        self._closing.set()
        self.models.listener = None
        self.say_held([])

    def say_alive(self) -> None:
        """Renew this process's `held_models` rows every ALIVE_SECONDS until it closes:
        an idle worker is handed the messages of its models' jobs only while it is seen
        (app/jobs/residency.py)."""

        def renew() -> None:
            while not self._closing.wait(residency.ALIVE_SECONDS):
                try:
                    with self.db.session() as session:
                        residency.seen(session, self.owner)
                except SQLAlchemyError as exc:
                    log.warning("could not renew the models held here: %s", exc)

        threading.Thread(target=renew, name="held-models", daemon=True).start()

    def say_held(self, names: list[str]) -> None:
        """Write down the models this process holds, for the other workers' hold
        (app/jobs/residency.py). Best effort: a write lost to a database outage only
        costs a hold until the next change."""
        try:
            with self.db.session() as session:
                residency.record(session, self.owner, names)
        except SQLAlchemyError as exc:
            log.warning("could not write down the models held here: %s", exc)

    def also_held(self, names: list[str]) -> set[str]:
        """Of `names`, the models another live worker holds too (best effort: none when
        the database cannot say, and the least recent is unloaded)."""
        try:
            with self.db.session() as session:
                return residency.also_held(session, self.owner, names)
        except SQLAlchemyError as exc:
            log.warning("could not read which models other workers hold: %s", exc)
            return set()

    def demand(self, names: list[str]) -> dict[str, Demand]:
        """Each of `names`' demand from the jobs table (best effort: none when the
        database cannot say, and the least recent of the rest is unloaded)."""
        try:
            with self.db.session() as session:
                counts = residency.demand(session, names, DEMAND_WINDOW)
        except SQLAlchemyError as exc:
            log.warning("could not read the loaded models' demand: %s", exc)
            return {}
        return {
            name: Demand(per_second=seen / DEMAND_WINDOW, queued=queued)
            for name, (seen, queued) in counts.items()
        }

    @property
    def idle_transaction_seconds(self) -> float:
        """A pool process frozen mid-transaction (a hung device call, a stopped VM) must
        not keep its job's row locked: the reaper could not take the job back when its
        lease expires. Its transactions are single statements and a commit, so half a
        lease (at most 30 s) is far above any it holds."""
        return min(30.0, max(2.0, self.settings.lease_seconds / 2))

    def warmth(self) -> Warmth | None:
        """What this worker holds warm, for the fair choice (docs/fair-share.md)."""
        if self.settings.warm_max_skips <= 0:
            return None
        held = self.models.held()
        return Warmth(
            models=tuple(name for name, _ in held),
            adapter_sets=self.adapter_memory.warm_sets(),
            max_skips=self.settings.warm_max_skips,
            share_slack=self.settings.warm_share_slack,
            loaded=tuple(
                (name, adapter_set)
                for name, model in held
                for adapter_set in self.adapter_memory.warm_sets(model.adapters)
            ),
        )

    def hold(self, job_id: uuid.UUID) -> threading.Event:
        """The stop flag of a job this process starts running (set at once if a shutdown
        already asked every job to go back)."""
        stop = threading.Event()
        if self.hand_back_requested.is_set():
            stop.set()
        self._running[job_id] = stop
        return stop

    def release(self, job_id: uuid.UUID) -> None:
        self._running.pop(job_id, None)
        self._yielding.pop(job_id, None)

    def begin_delivery(self) -> None:
        """A delivery of a message starts now (its clock: `delivery_seconds`)."""
        self.delivery_started = time.monotonic()

    def delivery_seconds(self) -> float:
        """How long the delivery being run has held its message."""
        return time.monotonic() - self.delivery_started

    @property
    def running(self) -> list[uuid.UUID]:
        return list(self._running)

    def on_cancel(self, _channel: str | None, payload: str | None) -> None:
        for job_id, stop in list(self._running.items()):
            if payload == str(job_id):
                stop.set()
            elif payload == f"{YIELD_PREFIX}{job_id}":
                self.yield_job(job_id)

    def yield_job(self, job_id: uuid.UUID, reason: str = HandBack.YIELD) -> None:
        """Ask a running job to checkpoint and go back to the queue at its next step;
        `reason` (a HandBack: a row's yield_reason names one) is kept for its hand-back, the
        first one given unless a bare notification's came first."""
        if job_id not in self._running:
            return
        if self._yielding.get(job_id, HandBack.YIELD) == HandBack.YIELD:
            known = reason in HandBack.__members__.values()
            self._yielding[job_id] = HandBack(reason) if known else HandBack.YIELD

    def leaving(self, job_id: uuid.UUID) -> bool:
        """Whether the job should leave at its next step if it checkpoints and would not
        finish soon: a shutdown began, or the job was asked to yield."""
        return self.draining.is_set() or job_id in self._yielding

    def handing_back(self, job_id: uuid.UUID) -> bool:
        """Whether a stop of this job returns it to the queue (rather than dropping it:
        canceled or taken over)."""
        return self.hand_back_reason(job_id) is not None

    def hand_back_reason(self, job_id: uuid.UUID) -> HandBack | None:
        """Why a stop of this job returns it to the queue; None: it is dropped."""
        reason = self._yielding.get(job_id)
        if reason is None and self.hand_back_requested.is_set():
            return HandBack.SHUTDOWN
        return reason

    def request_drain(self) -> None:
        """A shutdown began: start no further job; hand back the checkpointed ones that
        would not finish soon (workers/checkpoints.py `leaving`)."""
        self.hand_back_requested.set()
        self.draining.set()

    def request_hand_back(self) -> None:
        """Stop every running job at its next step and return it to the queue."""
        self.hand_back_requested.set()
        for stop in list(self._running.values()):
            stop.set()

    def report(self, job, outcome) -> None:
        """Tell the monitors (Flower) a handed-over job's outcome, once recorded; the task
        layer installs how (tasks/boot/gpu.py). Nothing by default."""

    def dead_letter(self, job, reason: str) -> bool:
        """A dead letter for a job whose message was already acked (app/broker/backend.py)."""
        return self.broker.dead_letter(self.celery, job, reason)

    def open_permits(self, queue: str):
        """Further messages of `queue` for a batch (where `broker.features.batching`)."""
        return self.broker.permits(self.celery, queue)


def _size_adapters(model: LoadedModel, settings) -> None:
    if model.adapters.fixed:  # a compiled model's: as many slots as a job may name
        return
    model.adapters.capacity = max(1, settings.adapter_slots)
    model.adapters.max_bytes = settings.adapter_device_bytes


def _count_from_zero(models: list[str]) -> None:
    """Every outcome this worker can count starts at 0, so that `rate()` sees its first
    increase (a counter born at 1 has no earlier sample to rise from)."""
    from app.jobs.states import ErrorCode
    from app.metrics.instruments import JOBS_FINISHED

    reasons_to_cancel = {ErrorCode.CANCELED, ErrorCode.DEADLINE}
    for model in models:
        JOBS_FINISHED.labels(model, "succeeded", "")
        for code in ErrorCode:
            if code not in reasons_to_cancel:
                JOBS_FINISHED.labels(model, "failed", code.value)


def _record_start(name: str, model: LoadedModel) -> None:
    """How long the model took to start, by phase (diffq_worker_model_start_seconds)."""
    from app.metrics.instruments import MODEL_START_SECONDS

    phases = {"load": model.load_seconds, "device": model.device_seconds, **model.warm_seconds}
    for phase, seconds in phases.items():
        MODEL_START_SECONDS.labels(name, phase).set(seconds)
    log.info(
        "model %s start: %s",
        name,
        ", ".join(f"{phase} {seconds:.2f}s" for phase, seconds in phases.items()),
    )


def served_models(catalog: Catalog, queues: list[str]) -> list[str]:
    """Every model whose queue this worker consumes: a shared queue means shared models."""
    return [spec.name for spec in catalog.models_for_queues(queues)]


def build_runtime(parent: Services, queues: list[str]) -> WorkerRuntime:
    """A pool process's root, over `parent`'s settings, catalog and Celery app, with its
    own connections (a pool for the main thread, progress writer, lease keepers and
    post-processing threads: 2 + DIFFQ_POSTPROCESS_DEPTH); every served model loaded and
    warmed (or the first DIFFQ_WORKER_MAX_MODELS, the others when a job needs them:
    workers/models.py). Raises ModelLoadError on the first model that fails."""
    settings, catalog = parent.settings, parent.catalog
    conditioning.CACHE.limit = settings.worker_conditioning_bytes
    device = select_device(settings.device)
    if device == "cpu":
        configure_cpu_threads()
    served = {name: catalog.models[name] for name in served_models(catalog, queues)}
    if any(spec.compile_sizes for spec in served.values()):
        use_compile_cache(settings.compile_cache)
    capacity = settings.worker_max_models

    def load(spec) -> LoadedModel:
        model = load_model(spec, device, settings.home / "digests")
        warm_seconds = warm_up(model)
        _size_adapters(model, settings)
        log.info(
            "model %s loaded on %s in %.2fs, warmed up in %.2fs",
            spec.name,
            device,
            model.load_seconds + model.device_seconds,
            warm_seconds,
        )
        _record_start(spec.name, model)
        return model

    def estimate(spec) -> int:
        return estimate_bytes(spec, resolve_dtype(spec, device).itemsize)

    budget = device_budget(device, settings.worker_model_bytes)
    models = ModelCache(served, load, capacity, budget, estimate)
    for name in served:  # each at start, or as many as DIFFQ_WORKER_MAX_MODELS and memory allow
        if models.fits(name):
            models.get(name)
    # What the result cache keys on, for every served model, loaded now or not.
    digests = {
        name: (
            models[name].digest
            if name in models
            else model_identity(spec, device, settings.home / "digests")[0]
        )
        for name, spec in served.items()
    }
    runtime = parent.derive(
        WorkerRuntime,
        db_pool_size=2 + settings.postprocess_depth,
        models=models,
        device=device,
        owner=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
        name=os.environ.get("DIFFQ_WORKER_NAME") or socket.gethostname(),
        postprocessor=(
            PostProcessor(settings.postprocess_depth) if settings.postprocess_depth > 0 else None
        ),
    )

    models.listener = runtime.say_held
    if settings.warm_hold_seconds > 0:  # with the hold, a job goes where its model is
        models.also_held = runtime.also_held
        models.demand = runtime.demand
    runtime.say_held(list(models))
    runtime.say_alive()

    def record_digests(session) -> None:
        for name, digest in digests.items():
            record_model_digest(session, name, digest)

    # A connection cut now (a database restart, a terminated backend) is not a model that
    # cannot load: ride it out as an outcome's write does, or the worker stops for good.
    record(runtime, record_digests)
    _count_from_zero(list(served))
    if runtime.db.engine.dialect.name == "postgresql":
        # Cancels reach a running job within one step; elsewhere, at the next progress write.
        runtime.cancel_listener = Listener(
            runtime.db.listen_url, [CANCEL_CHANNEL], runtime.on_cancel
        ).start()
    return runtime
