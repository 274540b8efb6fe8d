"""One attempt to deliver one webhook event, and what it leaves behind.

The attempt is recorded whatever happens. 2xx: delivered. 410: gone, and nothing more is
sent for that job. Anything else (an error status, a redirect — never followed — a
timeout, a name that does not resolve) schedules the next attempt on the retry schedule
with equal jitter, no sooner than the receiver's Retry-After; past the schedule's end,
failed. An address the policy refuses fails the event at once: retrying cannot help.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import urllib3
from sqlalchemy import update

from app.db import clock
from app.db.models.batches import Batch
from app.db.models.jobs import Job
from app.db.models.tenants import Tenant, new_webhook_secret
from app.db.models.webhooks import WebhookAttempt, WebhookEvent
from app.db.session import Database
from app.db.types import utcnow
from app.metrics.instruments import WEBHOOK_DELIVERIES, WEBHOOK_LATENCY
from app.webhooks import signing
from app.webhooks.guard import (
    Network,
    Resolver,
    Target,
    Unresolvable,
    UnsafeUrl,
    resolve_target,
    system_resolver,
)

log = logging.getLogger(__name__)
MAX_RETRY_AFTER = 24 * 3600.0
MAX_RESPONSE_BYTES = 64 * 1024


@dataclass(frozen=True)
class DeliveryConfig:
    schedule: tuple[float, ...]  # seconds before retry 1, 2, …; its length caps retries
    timeout: float
    allow: tuple[Network, ...] = ()
    resolve: Resolver = system_resolver


@dataclass(frozen=True)
class Response:
    status: int | None
    retry_after: float | None = None
    error: str | None = None
    refused: bool = False  # by the address policy: final, never retried


def message_id(event_id: uuid.UUID) -> str:
    return f"msg_{event_id.hex}"


def next_delay(config: DeliveryConfig, attempts: int, retry_after: float | None) -> float | None:
    """Seconds until the next attempt after `attempts` failed ones; None: give up."""
    if attempts > len(config.schedule):
        return None
    base = config.schedule[attempts - 1]
    delay = base / 2 + random.uniform(0, base / 2)  # equal jitter
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
    return delay


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def post(target: Target, headers: dict[str, str], body: bytes, timeout: float) -> Response:
    """POST to the checked address itself, with the URL's host as Host header and TLS
    server name; no redirects, no retries, a bounded read."""
    kwargs: dict[str, Any] = {
        "timeout": urllib3.Timeout(connect=timeout, read=timeout),
        "retries": False,
    }
    if target.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            target.address,
            target.port,
            server_hostname=target.host,
            assert_hostname=target.host,
            cert_reqs="CERT_REQUIRED",
            **kwargs,
        )
    else:
        pool = urllib3.HTTPConnectionPool(target.address, target.port, **kwargs)
    host = f"[{target.host}]" if ":" in target.host else target.host  # IPv6 literal
    if target.port != (443 if target.scheme == "https" else 80):
        host += f":{target.port}"
    try:
        response = pool.urlopen(
            "POST",
            target.path,
            body=body,
            headers={**headers, "host": host},
            redirect=False,
            preload_content=False,
        )
        response.read(MAX_RESPONSE_BYTES)
        response.release_conn()
    except urllib3.exceptions.NewConnectionError as exc:  # a subclass of the timeout error
        return Response(None, error=f"connection failed ({type(exc).__name__})")
    except urllib3.exceptions.TimeoutError:
        return Response(None, error=f"no answer within {timeout:g}s")
    except urllib3.exceptions.HTTPError as exc:
        return Response(None, error=f"connection failed ({type(exc).__name__})")
    finally:
        pool.close()
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    if 300 <= response.status < 400:
        return Response(response.status, retry_after, "redirect not followed")
    if not 200 <= response.status < 300:
        return Response(response.status, retry_after, f"answered {response.status}")
    return Response(response.status)


def signing_secrets(tenant: Tenant, now: datetime) -> list[str]:
    secrets = [tenant.webhook_secret or ""]
    until = tenant.webhook_secret_previous_until
    if tenant.webhook_secret_previous and until is not None and until > now:
        secrets.append(tenant.webhook_secret_previous)
    return secrets


def deliver(
    db: Database,
    config: DeliveryConfig,
    event_id: uuid.UUID,
    view: Callable[[Job], dict[str, Any]],
    send: Callable[[Target, dict[str, str], bytes, float], Response] = post,
) -> str:
    """Attempt one delivery of the event; returns its state afterwards."""
    with db.session() as session:
        event = session.get(WebhookEvent, event_id)
        if event is None or event.state != "pending":
            return event.state if event is not None else "missing"
        # A job's event, or a batch's end (app/batches): its `data` is that object.
        job = session.get(Job, event.job_id) if event.job_id else session.get(Batch, event.batch_id)
        tenant = session.get(Tenant, job.tenant_id)
        if tenant.webhook_secret is None:  # every tenant has one; this keeps it so
            tenant.webhook_secret = new_webhook_secret()
        if event.payload is None:
            event.payload = {
                "type": event.type,
                "timestamp": event.created_at.isoformat(),
                "data": view(job),
            }
        payload, url = event.payload, job.webhook_url
        secrets = signing_secrets(tenant, utcnow())
    body = json.dumps(payload, separators=(",", ":")).encode()
    started = time.perf_counter()
    started_at = utcnow()
    try:
        target = resolve_target(url, config.allow, config.resolve)
    except Unresolvable as exc:  # DNS may be back next time: retried on the schedule
        response = Response(None, error=f"not resolved: {exc}"[:300])
    except UnsafeUrl as exc:  # the policy says no: it will say no again, so fail now
        response = Response(None, error=f"refused: {exc}"[:300], refused=True)
    else:
        timestamp = int(time.time())
        headers = signing.headers(secrets, message_id(event_id), timestamp, body)
        response = send(target, headers, body, config.timeout)
    latency_ms = round((time.perf_counter() - started) * 1000)
    return _record(db, config, event_id, job.id, started_at, latency_ms, response)


def _record(db, config, event_id, job_id, started_at, latency_ms, response: Response) -> str:
    """`job_id`: the job's (or, for a batch's event, the batch's) id."""
    with db.session() as session:
        event = session.get(WebhookEvent, event_id, with_for_update=True)
        session.add(
            WebhookAttempt(
                event_id=event_id,
                started_at=started_at,
                status_code=response.status,
                latency_ms=latency_ms,
                error=response.error,
            )
        )
        event.attempts += 1
        event.dispatched_until = None
        if response.error is None:
            event.state = "delivered"
            event.delivered_at = utcnow()
        elif response.status == 410:
            event.state = "gone"
            session.execute(
                update(WebhookEvent)
                .where(
                    (WebhookEvent.job_id == job_id) | (WebhookEvent.batch_id == job_id),
                    WebhookEvent.state == "pending",
                )
                .values(state="gone")
            )
        elif response.refused:
            event.state = "failed"
        else:
            delay = next_delay(config, event.attempts, response.retry_after)
            if delay is None:
                event.state = "failed"
            else:
                event.next_attempt_at = clock.after(session, delay)
        state = event.state
    outcome = {"pending": "retry"}.get(state, state)
    if response.refused:
        outcome = "refused"
    WEBHOOK_DELIVERIES.labels(outcome).inc()
    WEBHOOK_LATENCY.observe(latency_ms / 1000)
    log.info(
        "webhook %s for job %s: attempt %s %s (%s ms)",
        message_id(event_id),
        job_id,
        event.attempts,
        response.error or f"delivered ({response.status})",
        latency_ms,
        extra={"job_id": str(job_id)},
    )
    return state
