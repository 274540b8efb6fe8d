"""Verifying diffq's webhooks (Standard Webhooks: HMAC-SHA256 of
"{webhook-id}.{webhook-timestamp}.{body}" under the tenant's `whsec_` secret)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from diffq.client.errors import InputError, WebhookVerificationError


def verify_webhook(
    body: bytes | str,
    headers: Mapping[str, str],
    secret: str,
    *,
    tolerance: float = 300.0,
    now: float | None = None,
) -> dict[str, Any]:
    """The event (`{"type", "timestamp", "data"}`) if the delivery is diffq's: one of the
    `webhook-signature` signatures matches under `secret` (during a rotation a delivery
    carries one per secret) and `webhook-timestamp` is within `tolerance` seconds.
    Raises WebhookVerificationError otherwise (InputError for a secret that is not one).
    Pass the body exactly as received."""
    raw = body.encode() if isinstance(body, str) else body
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        msg_id, stamp = lower["webhook-id"], lower["webhook-timestamp"]
        signatures = lower["webhook-signature"].split()
        timestamp = int(stamp)
    except (KeyError, ValueError) as exc:
        raise WebhookVerificationError("missing or malformed webhook headers") from exc
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise WebhookVerificationError("timestamp outside the tolerance (a replay?)")
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"))
    except ValueError:
        raise InputError("the secret is not a whsec_ secret (base64 after whsec_)") from None
    signed = f"{msg_id}.{timestamp}.".encode() + raw
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
    for signature in signatures:
        version, _, value = signature.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), expected):
            try:
                return json.loads(raw)
            except ValueError:
                raise WebhookVerificationError("the signed body is not JSON") from None
    raise WebhookVerificationError("no signature matches the secret")
