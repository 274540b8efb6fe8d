"""The webhook delivery worker's root (`diffq webhooks`): app/services.py's, plus the
delivery settings and the job view a webhook's `data` is (app/jobs/view.py, linked to
DIFFQ_PUBLIC_URL). No Flask: the worker renders jobs without an app."""

from __future__ import annotations

from typing import Any

from app.db.models.batches import Batch
from app.db.models.jobs import Job
from app.services import Services, resource
from app.webhooks.delivery import DeliveryConfig


class WebhookWorker(Services):
    @resource
    def delivery(self) -> DeliveryConfig:
        from app.webhooks.guard import parse_allow_list

        settings = self.settings
        return DeliveryConfig(
            schedule=settings.webhook_schedule,
            timeout=settings.webhook_timeout,
            allow=tuple(parse_allow_list(settings.webhook_allow_cidrs)),
        )

    def view(self, job: Job | Batch) -> dict[str, Any]:
        """The job (or batch) as a webhook's `data`: the API's answer for it, as JSON."""
        from app.jobs.view import job_json, job_view

        settings = self.settings
        if isinstance(job, Batch):
            from app.batches.render import batch_object

            return batch_object(job, dict(job.counts or {}), settings.public_url)
        return job_json(job_view(job, self.storage, settings.presign_ttl, settings.public_url))
