"""The webhook delivery task, run by CPU workers on the `webhooks` queue (`diffq webhooks`).

No Flask here: a webhook's `data` is app/jobs/view.py's job object, the one the API
answers GET /v1/jobs/{id} with, linked to DIFFQ_PUBLIC_URL (app/webhooks/worker.py).
"""

from __future__ import annotations

import uuid

from app.broker.payload import DELIVER_WEBHOOK_TASK
from tasks.celery_app import app


def worker_root():
    """This process's root as a webhook worker (tasks/boot/webhooks.py installs it; a
    process that delivers without that start, a test, gets one here)."""
    from app import services as root
    from app.webhooks.worker import WebhookWorker
    from tasks.celery_app import services

    current = services()
    if not isinstance(current, WebhookWorker):
        current = root.install(current.derive(WebhookWorker))
    return current


@app.task(name=DELIVER_WEBHOOK_TASK, acks_late=True, ignore_result=True)
def deliver_webhook(event_id: str) -> str:
    from app.webhooks.delivery import deliver

    svc = worker_root()
    return deliver(svc.db, svc.delivery, uuid.UUID(event_id), svc.view)
