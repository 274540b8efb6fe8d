"""The webhook delivery task, run by CPU workers on the `webhooks` queue (`diffq webhooks`).

No Flask here: a webhook's `data` is app/jobs/view.py's job object, the one the API
answers GET /v1/jobs/{id} with, linked to DIFFQ_PUBLIC_URL.
"""

from __future__ import annotations

import uuid
from functools import cache

from app.jobs.payload import DELIVER_WEBHOOK_TASK
from tasks.celery_app import app


@cache
def _context():
    """Per worker process: the database, the delivery settings and the job view."""
    from app.jobs.view import job_json, job_view
    from app.webhooks.delivery import DeliveryConfig
    from app.webhooks.guard import parse_allow_list
    from tasks.celery_app import services

    root = services()
    settings = root.settings

    def view(job):
        return job_json(job_view(job, root.storage, settings.presign_ttl, settings.public_url))

    config = DeliveryConfig(
        schedule=settings.webhook_schedule,
        timeout=settings.webhook_timeout,
        allow=tuple(parse_allow_list(settings.webhook_allow_cidrs)),
    )
    return root.db, config, view


@app.task(name=DELIVER_WEBHOOK_TASK, acks_late=True, ignore_result=True)
def deliver_webhook(event_id: str) -> str:
    from app.webhooks.delivery import deliver

    db, config, view = _context()
    return deliver(db, config, uuid.UUID(event_id), view)
