"""Factories for in-process runs: a database at head, tenants, job rows, and a worker
runtime around a fake pipeline. No broker, no S3, no worker process: the in-process tier
(tests/inprocess) and benchmarks build on these.

The database is SQLite (the embedded mode's own store) unless a URL is given: every state
change is the same conditional UPDATE on both, so the worker's execution path runs here
exactly as it runs against PostgreSQL, minus LISTEN/NOTIFY (a cancel then reaches a
running job through its progress write or the runtime's stop flag).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.broker.publish import mark_published
from app.catalog import Catalog, ModelSpec, tiny_spec
from app.config import Settings, load_settings
from app.db import migrate
from app.db.session import Database
from app.jobs import service
from app.jobs.states import Priority
from app.keys import get_or_create_tenant
from app.kinds import JobRequest, request_from_stored
from app.storage.local import LocalStorage
from workers.pipelines import LoadedModel
from workers.postprocess import PostProcessor
from workers.runtime import WorkerRuntime
from workers.synthetic import SyntheticPipeline

MODEL = "fake"


def settings_for(home: Path, **env: str) -> Settings:
    """Settings of an embedded-mode home in `home`, with DIFFQ_* overrides by name."""
    return load_settings(
        {"DIFFQ_HOME": str(home), **{f"DIFFQ_{k.upper()}": v for k, v in env.items()}}
    )


def database(settings: Settings) -> Database:
    """The settings' database, migrated to head."""
    migrate.upgrade(settings.database_url)
    return Database(settings.database_url, pool_size=4)


def tenant(db: Database, name: str | None = None) -> uuid.UUID:
    with db.session() as session:
        return get_or_create_tenant(session, name or f"t-{uuid.uuid4().hex[:8]}").id


def job_request(spec: ModelSpec | None = None, **overrides: Any) -> JobRequest:
    """A job's typed request, as the API normalizes it: at the model's defaults, or for
    no model at the tiny model's cheapest (64², 4 steps). `kind` picks the job kind."""
    values = {
        "prompt": "a red cube",
        "negative_prompt": None,
        "model": spec.name if spec else MODEL,
        "width": spec.default_width if spec else 64,
        "height": spec.default_height if spec else 64,
        "steps": spec.default_steps if spec else 4,
        "guidance_scale": 7.5,
        "num_images": 1,
        "seed": 7,
        "scheduler": "default",
        "output_format": "png",
        "priority": "normal",
    }
    values.update(overrides)
    return request_from_stored(values)


def queued_job(db: Database, tenant_id: uuid.UUID, spec: ModelSpec, **overrides: Any) -> uuid.UUID:
    """A queued, published job row (what the API leaves behind after a submit)."""
    with db.session() as session:
        job = service.create_job(
            session,
            tenant_id,
            model=spec.name,
            queue=spec.queue,
            priority=Priority.NORMAL,
            request=job_request(spec, **overrides),
            metadata=None,
        )
        mark_published(session, job.id)
        return job.id


def message(job_id: uuid.UUID, tenant_id: uuid.UUID) -> dict[str, Any]:
    """The task message a worker receives for the job (as the publisher builds it)."""
    from app.broker.payload import build_payload
    from app.db.models.jobs import Job

    return build_payload(Job(id=job_id, tenant_id=tenant_id, input={}))


class FakePipeline(SyntheticPipeline):
    """The synthetic stand-in with hooks: `at_step[k](step)` runs after denoising step k
    (1-based) and may raise (an out-of-memory error, a crash); `decodes` counts the runs
    that got past the denoising loop to produce images."""

    def __init__(self, seconds_per_image: float = 0.0) -> None:
        super().__init__(seconds_per_image)
        self.at_step: dict[int, Callable[[int], None]] = {}
        self._counts = {"calls": 0, "decodes": 0}

    @property
    def calls(self) -> int:
        return self._counts["calls"]

    @property
    def decodes(self) -> int:
        return self._counts["decodes"]

    def __call__(self, *, callback_on_step_end=None, **kwargs):
        self._counts["calls"] += 1
        hooks = self.at_step

        def callback(pipe, step_index, timestep, callback_kwargs):
            hook = hooks.get(step_index + 1)
            if hook is not None:
                hook(step_index + 1)
            if callback_on_step_end is not None:
                return callback_on_step_end(pipe, step_index, timestep, callback_kwargs)
            return callback_kwargs

        output = super().__call__(callback_on_step_end=callback, **kwargs)
        self._counts["decodes"] += 1
        return output


def runtime(
    settings: Settings,
    db: Database,
    pipeline: Any,
    *,
    spec: ModelSpec | None = None,
    postprocess: bool = False,
) -> WorkerRuntime:
    """A worker runtime serving one model backed by `pipeline`, storing into local files."""
    spec = spec or replace(tiny_spec(settings.home / "no-weights", name=MODEL, queue="gpu.fake"))
    return WorkerRuntime(
        settings=settings,
        catalog=Catalog(models={spec.name: spec}, default_model=spec.name),
        db=db,
        storage=LocalStorage(root=settings.home / "images", secret_key="in-process"),
        models={spec.name: LoadedModel(spec=spec, pipeline=pipeline, device="cpu", load_seconds=0)},
        device="cpu",
        owner=f"in-process:{uuid.uuid4().hex[:8]}",
        name="in-process",
        postprocessor=PostProcessor(1) if postprocess else None,
    )


def generate_one(model: LoadedModel, request: JobRequest, on_step=None) -> Any:
    """One job alone through the worker's one pipeline call (a batch of one): its
    Generation; raises workers.call.Interrupted when `on_step` stops it."""
    from workers.call import generate

    [output] = generate(model, [request], on_step=[on_step or (lambda *_: True)])
    return output
