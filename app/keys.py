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

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from app.db.models.tenants import ApiKey, Tenant
from app.db.session import execute_alone
from app.db.types import utcnow
from app.limits import Verdict, count_request, rate_verdict, window_of

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


def create_key(
    session: Session, tenant: Tenant, label: str | None = None, *, operator: bool = False
) -> str:
    """Store a new key for the tenant and return its plaintext (the only time it exists).
    An `operator`'s key may also pause and resume models (app/web/auth.py)."""
    new = generate_key()
    session.add(
        ApiKey(
            tenant_id=tenant.id,
            key_id=new.key_id,
            secret_hash=_hash(new.plaintext),
            label=label,
            operator=operator,
        )
    )
    session.flush()
    return new.plaintext


_keys, _tenants = ApiKey.__table__, Tenant.__table__
_FIND = (
    select(
        _keys.c.tenant_id,
        _keys.c.secret_hash,
        _keys.c.revoked_at,
        _keys.c.last_used_at,
        _tenants.c.daily_gpu_seconds,
    )
    .join_from(_keys, _tenants, _keys.c.tenant_id == _tenants.c.id)
    .where(_keys.c.key_id == bindparam("kid"))
)
_TOUCH = (
    update(_keys).where(_keys.c.key_id == bindparam("kid")).values(last_used_at=bindparam("now"))
)


@dataclass(frozen=True)
class Authenticated:
    tenant_id: uuid.UUID
    key_id: str
    touched: bool  # last_used_at written in the session's transaction, not committed yet
    daily_gpu_seconds: float | None  # the tenant's quota, read with the key


def authenticate(session: Session, presented: str) -> Authenticated | None:
    """Whose a presented key is, or None (malformed, unknown or revoked). One read; a
    stale last_used_at is updated in the caller's transaction."""
    match = _KEY_RE.match(presented)
    if match is None:
        return None
    key_id = match.group(1)
    row = session.execute(_FIND, {"kid": key_id}).first()
    if row is None or row.revoked_at is not None:
        return None
    if not hmac.compare_digest(row.secret_hash, _hash(presented)):
        return None
    now = utcnow()
    touched = row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION
    if touched:
        session.execute(_TOUCH, {"kid": key_id, "now": now})
    return Authenticated(row.tenant_id, key_id, touched, row.daily_gpu_seconds)


_ADMIT = (
    "SELECT tenant, daily_gpu_seconds, requests FROM diffq_authenticate("
    "%(kid)s, %(digest)s, %(win)s, %(limit)s, %(now)s, %(stale)s)"
)


@dataclass(frozen=True)
class Admission:
    """A request's key, found and counted: whose it is, and the rate limit's verdict."""

    key: Authenticated
    verdict: Verdict


def admit(session: Session, presented: str, rate_limit: int) -> Admission | None:
    """Authenticate a request and count it against its key's rate limit (`rate_limit` a
    minute; 0: not counted); None for a malformed, unknown or revoked key.

    PostgreSQL: one call in autocommit (`diffq_authenticate`, migration 0009), one round
    trip, committed without waiting for the WAL flush. Elsewhere: `authenticate`, then
    `count_request`, which commits.
    """
    if session.get_bind().dialect.name != "postgresql":
        found = authenticate(session, presented)
        if found is None:
            return None
        verdict = count_request(session, found.key_id, rate_limit)
        session.commit()  # last_used_at, when it was stale
        return Admission(found, verdict)
    match = _KEY_RE.match(presented)
    if match is None:
        return None
    now = utcnow()
    window = window_of(now)
    params = {
        "kid": match.group(1),
        "digest": _hash(presented),
        "win": window,
        "limit": rate_limit,
        "now": now,
        "stale": now - LAST_USED_RESOLUTION,
    }
    # A request counted twice, when its connection was lost mid-call, costs nothing.
    rows = execute_alone(session, _ADMIT, params, again_if_lost=True)
    if not rows:
        return None
    tenant, quota, requests = rows[0]
    key = Authenticated(uuid.UUID(str(tenant)), match.group(1), False, quota)
    return Admission(key, rate_verdict(requests, rate_limit, window, now))


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
