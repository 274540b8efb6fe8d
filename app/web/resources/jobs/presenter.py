"""The job object clients see, built from a row (URLs made at read time, so they stay fresh)."""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any
from urllib.parse import urljoin

from flask import request, url_for

from app.db.models import Job
from app.jobs.queue_info import QueueInfo
from app.storage import Storage
from app.webhooks.events import selected

_CURSOR_PREFIX = "v1:"


def encode_cursor(job_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(f"{_CURSOR_PREFIX}{job_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> uuid.UUID | None:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not raw.startswith(_CURSOR_PREFIX):
            return None
        return uuid.UUID(raw[len(_CURSOR_PREFIX) :])
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def _seconds(start, end) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def bytes_match(job: Job, original: Job | None) -> bool | None:
    """A replay's verdict: its images byte for byte equal to the original's; None until
    both have images with digests to compare."""
    if original is None or job.result is None or original.result is None:
        return None
    mine = [image.get("sha256") for image in job.result.get("images", [])]
    theirs = [image.get("sha256") for image in original.result.get("images", [])]
    if not mine or None in mine or None in theirs:
        return None
    return mine == theirs


def job_view(
    job: Job,
    storage: Storage,
    presign_ttl: int,
    queue: QueueInfo | None = None,
    original: Job | None = None,
) -> dict[str, Any]:
    result = None
    if job.result is not None:
        images = []
        for image in job.result.get("images", []):
            shown = {k: v for k, v in image.items() if k != "key"}
            shown["url"] = urljoin(request.host_url, storage.url(image["key"], presign_ttl))
            images.append(shown)
        result = {"images": images, "manifest": job.manifest}
    error = {"code": job.error_code, "message": job.error_message} if job.error_code else None
    return {
        "id": job.id,
        "status": job.status.value,
        "model": job.model,
        "input": job.input,
        "progress": job.progress,
        "queue_position": queue.position if queue else None,
        "eta_seconds": queue.eta_seconds if queue else None,
        "priority": job.priority.value,
        "attempts": job.attempts,
        "result": result,
        "error": error,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "metrics": {
            "queue_seconds": _seconds(job.created_at, job.started_at),
            "run_seconds": _seconds(job.started_at, job.finished_at),
        },
        "urls": {
            "self": url_for("jobs.JobById", job_id=job.id, _external=True),
            "cancel": url_for("jobs.JobCancel", job_id=job.id, _external=True),
            "events": url_for("job_events.JobEvents", job_id=job.id, _external=True),
        },
        "cost": {"gpu_seconds": round(job.gpu_seconds, 4), "device": job.device, "model": job.model}
        if job.gpu_seconds is not None
        else None,
        "metadata": job.client_metadata,
        "data_removed": job.data_removed_at is not None,
        "webhook": job.webhook_url,
        "webhook_events": list(selected(job.webhook_events)) if job.webhook_url else None,
        "cached": job.cached_from is not None,
        "cached_from": job.cached_from,
        "replay": (
            {"of": job.replay_of, "bytes_match": bytes_match(job, original)}
            if job.replay_of
            else None
        ),
    }
