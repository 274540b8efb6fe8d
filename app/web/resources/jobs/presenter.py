"""The job object in the API's answers (app/jobs/view.py, linked to the request's host), and
the job list's cursors."""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

from flask import request

from app.db.models.jobs import Job
from app.jobs import view
from app.jobs.queue_info import QueueInfo
from app.storage import Storage

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


def job_view(
    job: Job,
    storage: Storage,
    presign_ttl: int,
    queue: QueueInfo | None = None,
    original: Job | None = None,
) -> dict[str, Any]:
    """app/jobs/view.py's job view, with links to this request's host."""
    return view.job_view(job, storage, presign_ttl, request.url_root, queue, original)
