"""Bearer API-key authentication for every /v1 route."""

from __future__ import annotations

import uuid
from typing import NoReturn

from flask import g, request
from flask_smorest import abort

from app.keys import admit, key_id_of
from app.web.services import request_session, services

CHALLENGE = {"WWW-Authenticate": 'Bearer realm="diffq"'}


def _refuse(message: str, names: tuple[str | None, ...]) -> NoReturn:
    """401, counted against the client's address and the key id it named."""
    services().auth_failures.failed(*names)
    abort(401, message=message, headers=CHALLENGE)


def throttled(names: tuple[str | None, ...]) -> None:
    """429 before anything else when this address or key id failed too often."""
    retry_after = services().auth_failures.retry_after(*names)
    if retry_after is not None:
        abort(
            429,
            message="Too many failed authentications from this address or for this key; "
            f"at most {services().settings.auth_failures} a minute.",
            errors={"headers": {"Authorization": ["Too many failed attempts."]}},
            headers={"Retry-After": str(retry_after)},
        )


def client_names(presented: str | None) -> tuple[str | None, ...]:
    """What failures are counted against: the client's address and the key's id."""
    key_id = key_id_of(presented) if presented else None
    return (f"addr:{request.remote_addr}", f"key:{key_id}" if key_id else None)


def presented_key() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        return None
    return presented.strip()


def require_api_key() -> None:
    """A blueprint before_request hook: sets g.tenant_id or answers 401 (429 for an
    address or key id past DIFFQ_AUTH_FAILURES failures a minute, before the database)."""
    presented = presented_key()
    names = client_names(presented)
    throttled(names)
    if presented is None:
        _refuse("Missing API key: send 'Authorization: Bearer <key>'.", names)
    limit = services().settings.rate_limit
    admitted = admit(request_session(), presented, limit)  # committed
    if admitted is None:
        _refuse("Invalid or revoked API key.", names)
    if not admitted.verdict.allowed:
        abort(
            429,
            message=f"Rate limit: {limit} requests a minute per API key.",
            headers={"Retry-After": str(admitted.verdict.retry_after)},
        )
    g.tenant_id, g.tenant_quota = admitted.key.tenant_id, admitted.key.daily_gpu_seconds


def current_tenant() -> uuid.UUID:
    return g.tenant_id


def tenant_quota() -> float | None:
    """The tenant's daily GPU-second quota, as read with its key (None: no quota)."""
    return g.tenant_quota
