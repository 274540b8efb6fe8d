"""Bearer API-key authentication for every /v1 route."""

from __future__ import annotations

import functools
import uuid
from typing import NoReturn

from flask import g, request
from flask_smorest import abort
from sqlalchemy import select

from app.db.models.tenants import ApiKey
from app.keys import admit
from app.web.services import request_session, services

CHALLENGE = {"WWW-Authenticate": 'Bearer realm="diffq"'}


def _refuse(message: str, names: tuple[str | None, ...]) -> NoReturn:
    """401, counted against the client's address."""
    services().auth_failures.failed(*names)
    abort(401, message=message, headers=CHALLENGE)


def throttled(names: tuple[str | None, ...]) -> None:
    """429 before anything else when this address failed too often."""
    retry_after = services().auth_failures.retry_after(*names)
    if retry_after is not None:
        abort(
            429,
            message="Too many failed authentications from this address; "
            f"at most {services().settings.auth_failures} a minute.",
            errors={"headers": {"Authorization": ["Too many failed attempts."]}},
            headers={"Retry-After": str(retry_after)},
        )


def client_names(presented: str | None) -> tuple[str | None, ...]:
    """What failures are counted against: the client's address only. Not the key id the
    request names: a key id is no secret (it is in logs and listings), so a counter per
    key id would let anyone lock its owner out by failing on it; and guessing a key's
    256-bit secret is hopeless at any rate, so such a counter would protect nothing."""
    del presented  # the key it names does not change what the failure counts against
    return (f"addr:{request.remote_addr}",)


def presented_key() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        return None
    return presented.strip()


def require_api_key() -> None:
    """A blueprint before_request hook: sets g.tenant_id or answers 401 (429 for an
    address past DIFFQ_AUTH_FAILURES failures a minute, before the database)."""
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
    g.key_id = admitted.key.key_id


def operator_only(view):
    """A view only an operator's key may call: refused (403) before its body is read."""

    @functools.wraps(view)
    def checked(*args, **kwargs):
        require_operator()
        return view(*args, **kwargs)

    return checked


def require_operator() -> None:
    """403 unless the request's key is an operator's (`diffq keys create --operator`):
    what an operator may do (pause a model) reaches every tenant's jobs. One read, on
    operators' routes only."""
    found = request_session().scalar(select(ApiKey.operator).where(ApiKey.key_id == g.key_id))
    if not found:
        abort(
            403,
            message="This needs an operator's API key (diffq keys create --operator); "
            "a tenant's key may not pause or resume models.",
            errors={"headers": {"Authorization": ["Not an operator's key."]}},
        )


def current_tenant() -> uuid.UUID:
    return g.tenant_id


def tenant_quota() -> float | None:
    """The tenant's daily GPU-second quota, as read with its key (None: no quota)."""
    return g.tenant_quota
