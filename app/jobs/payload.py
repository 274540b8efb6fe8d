"""The versioned task message: {"v": 1, "job_id": …, "tenant": …, "params": {…}}."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from app.db.models import Job

PAYLOAD_VERSION = 1
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
    params: dict[str, Any]


def build_payload(job: Job) -> dict[str, Any]:
    return {
        "v": PAYLOAD_VERSION,
        "job_id": str(job.id),
        "tenant": str(job.tenant_id),
        "params": job.input,
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
    if version != PAYLOAD_VERSION:
        raise InvalidPayload(f"unsupported payload version {version!r}", job_id)
    params = raw.get("params")
    if not isinstance(params, dict):
        raise InvalidPayload("params is not an object", job_id)
    return TaskPayload(
        job_id=job_id, tenant=_uuid(raw.get("tenant"), "tenant", job_id), params=params
    )
