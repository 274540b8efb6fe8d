"""API keys: 256-bit random secrets with a recognisable prefix, stored only as SHA-256."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import uuid
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import ApiKey, Tenant
from app.db.types import utcnow

PREFIX = "dq_"
_KEY_RE = re.compile(r"^dq_([a-z2-7]{12})_([A-Za-z0-9_-]{43})$")
# Writing last_used_at on every request would turn each read into a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class NewKey:
    key_id: str
    plaintext: str


def generate_key() -> NewKey:
    key_id = base64.b32encode(secrets.token_bytes(10)).decode().lower()[:12]
    secret = secrets.token_urlsafe(32)  # 32 bytes = 256 bits
    return NewKey(key_id=key_id, plaintext=f"{PREFIX}{key_id}_{secret}")


def get_or_create_tenant(session: Session, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        tenant = Tenant(name=name)
        session.add(tenant)
        session.flush()
    return tenant


def create_key(session: Session, tenant: Tenant, label: str | None = None) -> str:
    """Store a new key for the tenant and return its plaintext (the only time it exists)."""
    new = generate_key()
    session.add(
        ApiKey(
            tenant_id=tenant.id, key_id=new.key_id, secret_hash=_hash(new.plaintext), label=label
        )
    )
    session.flush()
    return new.plaintext


def authenticate(session: Session, presented: str) -> uuid.UUID | None:
    """The tenant id a presented key belongs to, or None (malformed, unknown or revoked)."""
    match = _KEY_RE.match(presented)
    if match is None:
        return None
    row = session.scalar(select(ApiKey).where(ApiKey.key_id == match.group(1)))
    if row is None or row.revoked_at is not None:
        return None
    if not hmac.compare_digest(row.secret_hash, _hash(presented)):
        return None
    now = utcnow()
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
        row.last_used_at = now  # left for the caller's commit (session.dirty says so)
    return row.tenant_id


def revoke_key(session: Session, key_id: str) -> bool:
    """Revoke at once: the next request with the key is a 401 (nothing is cached)."""
    row = session.scalar(select(ApiKey).where(ApiKey.key_id == key_id))
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = utcnow()
    return True


def key_id_of(presented: str) -> str | None:
    match = _KEY_RE.match(presented)
    return match.group(1) if match else None
