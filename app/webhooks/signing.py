"""Standard Webhooks signatures (https://www.standardwebhooks.com): HMAC-SHA256 of
"{webhook-id}.{webhook-timestamp}.{body}" with the base64 secret after "whsec_"."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def headers(secrets: Iterable[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """One signature per secret, space-separated: during a rotation's overlap window a
    receiver holding either the old or the new secret verifies the delivery."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, msg_id, timestamp, body) for s in secrets),
        "content-type": "application/json",
        "user-agent": "diffq-webhooks/1",
    }
