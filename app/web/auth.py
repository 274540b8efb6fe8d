"""Bearer API-key authentication for every /v1 route."""

from __future__ import annotations

import uuid

from flask import g, request
from flask_smorest import abort

from app.keys import admit
from app.web.services import request_session, services

CHALLENGE = {"WWW-Authenticate": 'Bearer realm="diffq"'}


def require_api_key() -> None:
    """A blueprint before_request hook: sets g.tenant_id or answers 401."""
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        abort(
            401, message="Missing API key: send 'Authorization: Bearer <key>'.", headers=CHALLENGE
        )
    limit = services().settings.rate_limit
    admitted = admit(request_session(), presented.strip(), limit)  # committed
    if admitted is None:
        abort(401, message="Invalid or revoked API key.", headers=CHALLENGE)
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
