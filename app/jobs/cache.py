"""The result cache: a seeded request equal to an earlier succeeded one of the same tenant,
on the same weights, gets that job's images at once, as a new job marked `cached`.

The key is SHA-256 over the model's digest (ModelDigest, written by the workers that
loaded the model: its files, a separate VAE's, dtype, variant, safety checker) and the
request's fields that shape the images
(app/kinds `JobRequest.cache_fields`). The API sets a provisional key at submit; the
worker that runs the job writes the key from its own digest, so a result made on other
weights never answers for these. The images stay the source job's:
when retention removes them, its cached copies are marked removed too.
"""

from __future__ import annotations

import hashlib
import json
import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models.fleet import ModelDigest
from app.db.models.jobs import Job
from app.db.types import utcnow
from app.jobs import transitions
from app.jobs.results import RESULT_FILES
from app.jobs.states import JobStatus
from app.kinds import JobRequest, job_request
from app.rules import SCHEDULERS


def cache_key(model_digest: str, request: JobRequest) -> str:
    """`model_digest`: all that the loaded model fixes (workers/manifest.py); the request's
    fields that shape the images (app/kinds), and what its scheduler's name stands for
    (the class and options of app/rules.py's table: a release that changes them changes
    the images)."""
    scheduler = SCHEDULERS.get(request.scheduler)
    shown = {
        **request.cache_fields(),
        "scheduler_is": [scheduler.class_name, scheduler.options] if scheduler else None,
    }
    canonical = json.dumps([model_digest, shown], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def model_digest(session: Session, model: str) -> str | None:
    return session.scalar(select(ModelDigest.digest).where(ModelDigest.model == model))


def record_model_digest(session: Session, model: str, digest: str) -> None:
    """Upsert: the digest the latest worker to load `model` computed."""
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    now = utcnow()
    statement = insert(ModelDigest).values(model=model, digest=digest, updated_at=now)
    session.execute(
        statement.on_conflict_do_update(
            index_elements=["model"], set_={"digest": digest, "updated_at": now}
        )
    )


def find_cached(session: Session, tenant_id: uuid.UUID, key: str) -> Job | None:
    """The tenant's newest live result for this key."""
    return session.scalar(
        select(Job)
        .where(
            Job.tenant_id == tenant_id,
            Job.cache_key == key,
            Job.status == JobStatus.SUCCEEDED,
            Job.data_removed_at.is_(None),
        )
        .order_by(Job.finished_at.desc())
        .limit(1)
    )


def serve_from_cache(session: Session, job: Job, source: Job) -> None:
    """Finish the just-created `job` with `source`'s result (its images stay the source's).

    Goes through the usual transition, so watchers, SSE and webhooks see it finish.
    """
    now, steps = utcnow(), job_request(job).denoise_steps
    transitions.change(
        session,
        job.id,
        Job.status == JobStatus.QUEUED,
        status=JobStatus.SUCCEEDED,
        result={
            name: list(files)
            for name, files in (source.result or {}).items()
            if name in RESULT_FILES
        },
        manifest=source.manifest,
        cached_from=source.cached_from or source.id,
        progress=transitions.progress_of("done", steps, steps),
        started_at=now,
        finished_at=now,
        published_at=now,  # nothing for the relay to publish
    )
    session.refresh(job)
