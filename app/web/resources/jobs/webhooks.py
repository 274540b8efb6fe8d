"""A job's webhook deliveries: every event and every attempt, and redelivery."""

from __future__ import annotations

import uuid

import marshmallow as ma
from flask.views import MethodView
from flask_smorest import abort
from marshmallow import fields
from sqlalchemy import select, update

from app.db import clock
from app.db.models.webhooks import WebhookAttempt, WebhookEvent
from app.jobs import service
from app.web.auth import current_tenant, require_api_key
from app.web.bodies import Blueprint
from app.web.errors import found
from app.web.services import request_session
from app.webhooks.delivery import message_id

blp = Blueprint(
    "job_webhooks",
    __name__,
    url_prefix="/v1/jobs",
    description="Webhook deliveries of a job, attempt by attempt.",
)
blp.before_request(require_api_key)


class AttemptSchema(ma.Schema):
    started_at = fields.DateTime()
    status_code = fields.Integer(
        allow_none=True,
        metadata={
            "description": "The receiver's 2xx, or 410; null for any other outcome (no "
            "answer, or another status: `error` says which)"
        },
    )
    latency_ms = fields.Integer(
        allow_none=True, metadata={"description": "null unless the attempt was answered 2xx/410"}
    )
    error = fields.String(
        allow_none=True,
        metadata={
            "description": "null when delivered; else one class: `unreachable` (no HTTP "
            "answer: not resolved, refused, timed out, TLS), `non-2xx` (an HTTP answer "
            "other than 2xx, redirects included), `refused` (an address the policy refuses)"
        },
    )


class EventSchema(ma.Schema):
    id = fields.String(metadata={"description": "The `webhook-id` header of every attempt."})
    type = fields.String()
    created_at = fields.DateTime()
    state = fields.String(
        metadata={
            "description": "pending (retrying), delivered, failed (schedule exhausted), "
            "gone (the receiver answered 410: nothing more is sent for this job)"
        }
    )
    next_attempt_at = fields.DateTime(allow_none=True)
    attempts = fields.List(fields.Nested(AttemptSchema))


class DeliveriesSchema(ma.Schema):
    data = fields.List(fields.Nested(EventSchema))


def _job_or_404(job_id: uuid.UUID):
    return found(service.get_job(request_session(), current_tenant(), job_id), "job")


def _attempt_view(attempt: WebhookAttempt) -> dict:
    """What a tenant sees of an attempt: a class of outcome, never the connection error,
    the status code or the timing of a failed one. Those would answer "is this port of
    that host open, and what listens there?" for any public address a webhook may name;
    the delivery worker's log keeps them for operators."""
    shown = attempt.error is None or attempt.status_code == 410
    return {
        "started_at": attempt.started_at,
        "status_code": attempt.status_code if shown else None,
        "latency_ms": attempt.latency_ms if shown else None,
        "error": None if attempt.error is None else failure_class(attempt),
    }


def failure_class(attempt: WebhookAttempt) -> str:
    if attempt.error.startswith("refused"):
        return "refused"
    return "non-2xx" if attempt.status_code is not None else "unreachable"


def _event_view(event: WebhookEvent, attempts: list[WebhookAttempt]) -> dict:
    return {
        "id": message_id(event.id),
        "type": event.type,
        "created_at": event.created_at,
        "state": event.state,
        "next_attempt_at": event.next_attempt_at if event.state == "pending" else None,
        "attempts": [_attempt_view(attempt) for attempt in attempts],
    }


@blp.route("/<uuid:job_id>/webhooks")
class JobWebhooks(MethodView):
    @blp.response(200, DeliveriesSchema)
    @blp.alt_response(404, description="No such job (or not yours).")
    def get(self, job_id: uuid.UUID):
        """List a job's webhook deliveries

        Every event sent (or being retried) for the job, oldest first, with each attempt's
        outcome: its status code and latency when delivered, else the class of failure.
        """
        _job_or_404(job_id)
        session = request_session()
        events = list(
            session.scalars(
                select(WebhookEvent)
                .where(WebhookEvent.job_id == job_id)
                .order_by(WebhookEvent.created_at, WebhookEvent.id)
            )
        )
        attempts: dict[uuid.UUID, list[WebhookAttempt]] = {e.id: [] for e in events}
        if events:
            for attempt in session.scalars(
                select(WebhookAttempt)
                .where(WebhookAttempt.event_id.in_(list(attempts)))
                .order_by(WebhookAttempt.started_at)
            ):
                attempts[attempt.event_id].append(attempt)
        return {"data": [_event_view(e, attempts[e.id]) for e in events]}


@blp.route("/<uuid:job_id>/webhooks/redeliver")
class JobWebhookRedeliver(MethodView):
    @blp.response(202, EventSchema)
    @blp.alt_response(404, description="No such job (or not yours), or no event sent yet.")
    def post(self, job_id: uuid.UUID):
        """Send the last event again

        The job's most recent event goes back to the delivery queue with the same
        `webhook-id` (receivers deduplicate on it) and a fresh retry schedule.
        """
        _job_or_404(job_id)
        session = request_session()
        event = session.scalar(
            select(WebhookEvent)
            .where(WebhookEvent.job_id == job_id)
            .order_by(WebhookEvent.created_at.desc(), WebhookEvent.id.desc())
            .limit(1)
        )
        if event is None:
            abort(404, message="No webhook event for this job yet.")
        session.execute(
            update(WebhookEvent)
            .where(WebhookEvent.id == event.id)
            .values(
                state="pending",
                attempts=0,
                next_attempt_at=clock.now(session),
                dispatched_until=None,
            )
        )
        session.commit()
        session.refresh(event)
        return _event_view(event, []), 202
