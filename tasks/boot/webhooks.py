"""A webhook delivery worker (`diffq webhooks`): no model, nothing in its pool threads."""

from __future__ import annotations

import logging

from celery.exceptions import WorkerShutdown

from app import services as root
from app.broker.topology import WEBHOOK_QUEUE
from app.webhooks.worker import WebhookWorker
from tasks.boot.common import declare
from tasks.celery_app import services

log = logging.getLogger(__name__)


def start(sender, queues: list[str]) -> None:
    from workers import metrics as worker_metrics

    if queues != [WEBHOOK_QUEUE]:
        raise WorkerShutdown("webhooks are delivered by their own workers (`diffq webhooks`)")
    # Its delivery threads share the root's database pool: pool plus overflow (as many
    # again) gives each thread a connection.
    pool = max(1, (sender.concurrency + 1) // 2)
    root.install(services().derive(WebhookWorker, db_pool_size=pool))
    worker_metrics.serve(services().settings)
    declare(sender, queues)  # last: a broker away at start leaves the rest set up
    log.info("worker delivers webhooks from queue %s", WEBHOOK_QUEUE)
