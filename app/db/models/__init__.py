"""The tables, a module per feature; every mapped class is imported here, so that
SQLAlchemy knows them all (their foreign keys name each other's tables) whichever one a
caller imports first.

- `tenants`: tenants and API keys
- `jobs`: jobs (their own publish outbox)
- `inputs`: uploads and LoRA adapters
- `batches`: batches and files
- `webhooks`: the webhook outbox and its attempts
- `limits`: rate, failed-auth, ticket, reservation and usage counts
- `fleet`: model pauses, held models, weight digests
"""

from app.db.base import Base
from app.db.models.batches import Batch, BatchFile
from app.db.models.fleet import HeldModel, ModelDigest, ModelPause
from app.db.models.inputs import Adapter, Upload
from app.db.models.jobs import CACHE_WHERE, DEADLINE_WHERE, Job
from app.db.models.limits import (
    AuthFailure,
    DailyUsage,
    RequestCount,
    SubmitReservation,
    UsedTicket,
)
from app.db.models.tenants import ApiKey, Tenant, new_webhook_secret
from app.db.models.webhooks import WebhookAttempt, WebhookEvent

__all__ = [
    "CACHE_WHERE",
    "DEADLINE_WHERE",
    "Adapter",
    "ApiKey",
    "AuthFailure",
    "Base",
    "Batch",
    "BatchFile",
    "DailyUsage",
    "HeldModel",
    "Job",
    "ModelDigest",
    "ModelPause",
    "RequestCount",
    "SubmitReservation",
    "Tenant",
    "Upload",
    "UsedTicket",
    "WebhookAttempt",
    "WebhookEvent",
    "new_webhook_secret",
]
