"""What a worker process holds for its whole life: settings, database, store, loaded models."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass, field, replace

from app.catalog import Catalog
from app.config import Settings
from app.db.session import Database
from app.jobs.cache import record_model_digest
from app.jobs.listener import Listener
from app.jobs.notify import CANCEL_CHANNEL
from app.services import Services
from app.storage import Storage
from workers.devices import configure_cpu_threads, select_device
from workers.pipelines import LoadedModel, load_model, warm_up
from workers.postprocess import PostProcessor

log = logging.getLogger(__name__)


@dataclass
class WorkerRuntime:
    settings: Settings
    catalog: Catalog
    db: Database
    storage: Storage
    models: dict[str, LoadedModel]
    device: str
    owner: str
    name: str  # the Celery node name (gpu0@host): a label on this worker's metrics
    # The job this process is running, and the flag that stops it at the next step: raised
    # by a cancel notification, a lost lease, or a shutdown that outlasts its grace period.
    current_job: uuid.UUID | None = None
    stop_requested: threading.Event = field(default_factory=threading.Event)
    # Set by a shutdown: the stopped job goes back to the queue instead of being dropped.
    hand_back_requested: threading.Event = field(default_factory=threading.Event)
    # Encodes, uploads and records finished jobs while the GPU runs the next (None: inline).
    postprocessor: PostProcessor | None = None
    # The jobs of a running batch (workers/batch.py), each with its own stop flag: a cancel
    # takes that job out of the batch at the next step, the others go on.
    batch_stops: dict[uuid.UUID, threading.Event] = field(default_factory=dict)

    def start_job(self, job_id: uuid.UUID) -> None:
        self.current_job = job_id
        self.stop_requested.clear()
        if self.hand_back_requested.is_set():
            self.stop_requested.set()

    def end_job(self) -> None:
        self.current_job = None
        self.stop_requested.clear()

    def on_cancel(self, _channel: str | None, payload: str | None) -> None:
        if payload is not None and payload == str(self.current_job):
            self.stop_requested.set()
        for job_id, stop in list(self.batch_stops.items()):
            if payload == str(job_id):
                stop.set()

    def request_hand_back(self) -> None:
        """Stop the current job at its next step and return it to the queue."""
        self.hand_back_requested.set()
        self.stop_requested.set()
        for stop in list(self.batch_stops.values()):
            stop.set()


def served_models(catalog: Catalog, queues: list[str]) -> list[str]:
    """Every model whose queue this worker consumes: a shared queue means shared models."""
    return [spec.name for spec in catalog.models_for_queues(queues)]


def build_runtime(services: Services, queues: list[str]) -> WorkerRuntime:
    """Load and warm every served model; raises ModelLoadError on the first that fails.
    `services` is the pool process's root (its database pool: main thread, progress
    writer, lease keepers, post-processing threads: 2 + DIFFQ_POSTPROCESS_DEPTH)."""
    settings, catalog = services.settings, services.catalog
    device = select_device(settings.device)
    if device == "cpu":
        configure_cpu_threads()
    models: dict[str, LoadedModel] = {}
    # Entries that name the same weights (say, one model with two sets of limits) share
    # one pipeline in memory.
    loaded: dict[tuple, LoadedModel] = {}
    for name in served_models(catalog, queues):
        spec = catalog.models[name]
        weights = (spec.path.resolve(), spec.dtype)
        shared = loaded.get(weights)
        if shared is not None:
            manifest = {**(shared.manifest or {}), "model": name}
            models[name] = replace(shared, spec=spec, manifest=manifest)
            log.info("model %s shares the pipeline already loaded from %s", name, spec.path)
            continue
        model = load_model(spec, device)
        warm_seconds = warm_up(model)
        log.info(
            "model %s loaded on %s in %.2fs, warmed up in %.2fs",
            name,
            device,
            model.load_seconds,
            warm_seconds,
        )
        models[name] = loaded[weights] = model
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    runtime = WorkerRuntime(
        settings=settings,
        catalog=catalog,
        db=services.db,
        storage=services.storage,
        models=models,
        device=device,
        owner=owner,
        name=os.environ.get("DIFFQ_WORKER_NAME") or socket.gethostname(),
        postprocessor=(
            PostProcessor(settings.postprocess_depth) if settings.postprocess_depth > 0 else None
        ),
    )
    with runtime.db.session() as session:
        for name, model in models.items():  # what the result cache keys on
            record_model_digest(session, name, model.digest)
    if runtime.db.engine.dialect.name == "postgresql":
        # Cancels reach a running job within one step; elsewhere, at the next progress write.
        Listener(settings.database_url, [CANCEL_CHANNEL], runtime.on_cancel).start()
    return runtime
