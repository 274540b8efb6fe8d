"""What the sync and the asyncio clients share: settings, request building, the retry
rule, error mapping and the event-stream parser. No I/O here."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from diffq.client.errors import error_for

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = ("succeeded", "failed", "canceled")
BATCH_ENDED = ("completed", "expired", "cancelled", "failed")
RETRIED = (429, 502, 503, 504)
MAX_BACKOFF = 8.0


@dataclass(frozen=True)
class Event:
    """One event of a job's stream: `status` (data: the job) or `progress`."""

    name: str
    data: dict[str, Any]
    id: str | None = None


def settings(url: str | None, api_key: str | None) -> tuple[str, str]:
    url = (url or os.environ.get("DIFFQ_URL") or DEFAULT_URL).rstrip("/")
    key = api_key or os.environ.get("DIFFQ_API_KEY")
    if not key:
        raise ValueError("an API key is needed: api_key= or DIFFQ_API_KEY")
    return url, key


def headers_for(method: str, given: Mapping[str, str] | None) -> dict[str, str]:
    """A POST gets an Idempotency-Key (kept across its retries): a retry after a lost
    answer finds the job or batch the first attempt made, never a second one."""
    headers = dict(given or {})
    if method == "POST" and "Idempotency-Key" not in headers:
        headers["Idempotency-Key"] = str(uuid.uuid4())
    return headers


def backoff(attempt: int, retry_after: float | None) -> float:
    if retry_after is not None:
        return min(retry_after, MAX_BACKOFF * 4)
    return min(MAX_BACKOFF, 0.5 * 2**attempt)


def retry_after_of(headers: Mapping[str, str]) -> float | None:
    raw = headers.get("retry-after")
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def raise_for(status: int, content: bytes, headers: Mapping[str, str]) -> None:
    if status < 400:
        return
    try:
        body = json.loads(content) if content else {}
    except ValueError:
        body = {"message": content[:500].decode(errors="replace")}
    raise error_for(status, body, retry_after_of(headers))


def job_body(prompt: str | None, fields: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in fields.items() if v is not None}
    if prompt is not None:
        body["prompt"] = prompt
    return body


def batch_body(
    requests: Iterable[Mapping[str, Any]],
    completion_window: str | int | None,
    webhook: str | None,
    metadata: dict[str, Any] | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"requests": [dict(r) for r in requests]}
    for name, value in (
        ("completion_window", completion_window),
        ("webhook", webhook),
        ("metadata", metadata),
    ):
        if value is not None:
            body[name] = value
    return body


class SSEParser:
    """Server-Sent Events, a line at a time: `feed(line)` gives an Event at each blank
    line that ends one; `last_id` is what to resume from."""

    def __init__(self) -> None:
        self.last_id: str | None = None
        self._name, self._data = "message", []

    def feed(self, line: str) -> Event | None:
        if line == "":
            event = None
            if self._data:
                event = Event(self._name, json.loads("\n".join(self._data)), self.last_id)
            self._name, self._data = "message", []
            return event
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "id":
            self.last_id = value
        elif field == "event":
            self._name = value
        elif field == "data":
            self._data.append(value)
        return None


def jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]
