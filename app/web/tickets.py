"""WebSocket tickets: what a browser passes as `?ticket=` instead of an API key.

A ticket is signed with DIFFQ_SECRET_KEY, names its tenant, its job and a random id, and
lives DIFFQ_WS_TICKET_TTL seconds. It opens one socket: the first handshake that
presents it spends it (a row in `used_tickets`, whose primary key makes the second
spend fail on any API process), and a spent ticket is refused like a bad one. Rows are
removed once their ticket has expired anyway. The access log never shows it
(app/web/access_log.py).
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer
from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.models.limits import UsedTicket
from app.db.types import utcnow

MAX_TICKET_CHARS = 512
SALT = "diffq-ws-ticket"


@dataclass(frozen=True)
class Ticket:
    tenant_id: uuid.UUID
    job_id: uuid.UUID
    ticket_id: str
    expires_at: datetime


def _serializer(secret_key: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(secret_key, salt=SALT)


def make_ticket(secret_key: str, tenant_id: uuid.UUID, job_id: uuid.UUID) -> str:
    return _serializer(secret_key).dumps(
        {"t": str(tenant_id), "j": str(job_id), "n": secrets.token_hex(16)}
    )


def read_ticket(secret_key: str, ttl: int, ticket: str, job_id: uuid.UUID) -> Ticket | None:
    """The ticket's claims when it is well signed, unexpired and for this job; else None.
    Reading does not spend it."""
    if len(ticket) > MAX_TICKET_CHARS:
        return None
    try:
        claims, signed_at = _serializer(secret_key).loads(
            ticket, max_age=ttl, return_timestamp=True
        )
        if claims.get("j") != str(job_id) or not isinstance(claims.get("n"), str):
            return None
        tenant_id = uuid.UUID(claims["t"])
    except (SignatureExpired, BadSignature, ValueError, KeyError, TypeError, AttributeError):
        return None
    signed_at = signed_at if signed_at.tzinfo else signed_at.replace(tzinfo=UTC)
    return Ticket(tenant_id, job_id, claims["n"][:32], signed_at + timedelta(seconds=ttl + 1))


def spend(session: Session, ticket: Ticket) -> bool:
    """True the first time a ticket is spent, on any process; False after. Commits."""
    session.execute(delete(UsedTicket).where(UsedTicket.expires_at < utcnow()))
    session.add(UsedTicket(ticket_id=ticket.ticket_id, expires_at=ticket.expires_at))
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        return False
    return True
