"""The webhook delivery task, run by CPU workers on the `webhooks` queue (`diffq webhooks`)."""

from __future__ import annotations

import uuid
from functools import cache

from app.jobs.payload import DELIVER_WEBHOOK_TASK
from tasks.celery_app import app


@cache
def _context():
    """Per worker process: the database, the delivery settings, and the job view the
    API answers GET /v1/jobs/{id} with (so a webhook's `data` is the same object)."""
    from app.web.factory import create_app
    from app.web.resources.jobs.presenter import job_view
    from app.web.resources.jobs.schemas import JobSchema
    from app.web.services import services
    from app.webhooks.delivery import DeliveryConfig
    from app.webhooks.guard import parse_allow_list
    from tasks.celery_app import services as root

    settings = root().settings
    flask_app = create_app(settings)
    schema = JobSchema()

    def view(job):
        with flask_app.test_request_context(base_url=settings.public_url):
            svc = services()
            return schema.dump(job_view(job, svc.storage, svc.settings.presign_ttl))

    config = DeliveryConfig(
        schedule=settings.webhook_schedule,
        timeout=settings.webhook_timeout,
        allow=tuple(parse_allow_list(settings.webhook_allow_cidrs)),
    )
    # The app's own database pool serves the deliveries too (its watcher starts no
    # listener until a stream subscribes, which never happens here).
    return flask_app.extensions["diffq"].db, config, view


@app.task(name=DELIVER_WEBHOOK_TASK, acks_late=True, ignore_result=True)
def deliver_webhook(event_id: str) -> str:
    from app.webhooks.delivery import deliver

    db, config, view = _context()
    return deliver(db, config, uuid.UUID(event_id), view)
