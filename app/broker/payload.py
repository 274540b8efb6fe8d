"""The versioned task message: ids only, {"v": 2, "job_id": …, "tenant": …,
"requeues": n}.

The worker reads everything else from the job row, which is the truth (and may have
moved on since the publish). `requeues` is how many times the job had been handed back
to the queue when this message was published (`jobs.requeues`): a redelivered message
whose count is behind the row's is stale (workers/claim.py). A message without it (from
before the field) is read as it always was. Version 1 also carried the request as
"params"; such a message, still queued when the workers are upgraded, is run the same
way (its params are ignored).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from app.db.models.jobs import Job

PAYLOAD_VERSION = 2
ACCEPTED_VERSIONS = (1, 2)  # 1: {"v": 1, …, "params": {…}}, published before version 2
GENERATE_TASK = "diffq.generate"
DELIVER_WEBHOOK_TASK = "diffq.deliver_webhook"  # args: [event id]


class InvalidPayload(ValueError):
    """A message no worker can act on; it goes to the dead-letter queue."""

    def __init__(self, reason: str, job_id: uuid.UUID | None = None) -> None:
        super().__init__(reason)
        self.job_id = job_id


@dataclass(frozen=True)
class TaskPayload:
    job_id: uuid.UUID
    tenant: uuid.UUID
    requeues: int | None = None  # None: a message from before the field


def build_payload(job: Job) -> dict[str, Any]:
    return {
        "v": PAYLOAD_VERSION,
        "job_id": str(job.id),
        "tenant": str(job.tenant_id),
        "requeues": job.requeues or 0,  # a job just stored: never handed back
    }


def _uuid(raw: Any, name: str, job_id: uuid.UUID | None = None) -> uuid.UUID:
    try:
        return uuid.UUID(str(raw))
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{name} is not a UUID: {raw!r:.80}", job_id) from exc


def parse_payload(raw: Any) -> TaskPayload:
    if not isinstance(raw, dict):
        raise InvalidPayload(f"payload is a {type(raw).__name__}, not an object")
    job_id = _uuid(raw.get("job_id"), "job_id")
    version = raw.get("v")
    if version not in ACCEPTED_VERSIONS:
        raise InvalidPayload(f"unsupported payload version {version!r}", job_id)
    requeues = raw.get("requeues")
    if requeues is not None and (
        isinstance(requeues, bool) or not isinstance(requeues, int) or requeues < 0
    ):
        raise InvalidPayload(f"requeues is not a count: {requeues!r:.80}", job_id)
    tenant = _uuid(raw.get("tenant"), "tenant", job_id)
    return TaskPayload(job_id=job_id, tenant=tenant, requeues=requeues)
