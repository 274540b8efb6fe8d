"""What the sync and the asyncio clients share: settings, request building, the retry
rule, error mapping, reading answers and JSON Lines, and the event-stream parser. No I/O
here but reading a file the caller names."""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from diffq.client.errors import (
    APIConnectionError,
    GoneError,
    InputError,
    InvalidResponseError,
    error_for,
)

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = ("succeeded", "failed", "canceled")
BATCH_ENDED = ("completed", "expired", "cancelled", "failed")
RETRIED = (429, 502, 503, 504)
MAX_BACKOFF = 8.0
# An event stream that cannot reconnect this many times in a row (backoff between,
# about 40 s in all) gives up with APIConnectionError.
STREAM_RECONNECTS = 8
# What httpx2 raises besides a transport's failure (retried): no answer to read either.
UNANSWERED = (httpx2.HTTPError, httpx2.InvalidURL, httpx2.StreamError)


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
        raise InputError("an API key is needed: api_key= or DIFFQ_API_KEY")
    if not url.startswith(("http://", "https://")):
        raise InputError(f"the API URL must start with http:// or https://, not {url!r}")
    return url, key


def headers_for(method: str, given: Mapping[str, str] | None) -> dict[str, str]:
    """A POST gets an Idempotency-Key (kept across its retries): a retry after a lost
    answer finds the job or batch the first attempt made, never a second one."""
    headers = dict(given or {})
    if method == "POST" and "Idempotency-Key" not in headers:
        headers["Idempotency-Key"] = str(uuid.uuid4())
    return headers


def encoded(kwargs: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """A `json=` body encoded here (as httpx2 would), so that a value JSON cannot hold is
    an InputError before anything is sent."""
    if "json" not in kwargs:
        return kwargs
    kwargs = dict(kwargs)
    body = kwargs.pop("json")
    try:
        kwargs["content"] = json.dumps(
            body, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()
    except (TypeError, ValueError) as exc:
        raise InputError(f"the request cannot be sent as JSON: {exc}") from None
    headers.setdefault("Content-Type", "application/json")
    return kwargs


def connection_error(method: str, path: str, exc: Exception) -> APIConnectionError:
    where = path.partition("?")[0]  # never a presigned link's signature
    return APIConnectionError(f"{method} {where}: {exc or type(exc).__name__}")


def should_retry(status: int, headers: Mapping[str, str]) -> bool:
    """429 and 502-504 are retried, unless the answer says `x-should-retry: false` (the
    batch routes' 5xx answers do)."""
    return status in RETRIED and headers.get("x-should-retry", "").lower() != "false"


def backoff(attempt: int, retry_after: float | None) -> float:
    if retry_after is not None:
        return min(retry_after, MAX_BACKOFF * 4)
    return min(MAX_BACKOFF, 0.5 * 2**attempt)


def retry_after_of(headers: Mapping[str, str]) -> float | None:
    raw = headers.get("retry-after")
    try:
        seconds = float(raw) if raw is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


def raise_for(status: int, content: bytes, headers: Mapping[str, str]) -> None:
    if status < 400:
        return
    try:
        body = json.loads(content) if content else {}
    except ValueError:
        body = {"message": content[:500].decode(errors="replace")}
    raise error_for(status, body, retry_after_of(headers))


def answer(status: int, content: bytes, *keys: str) -> dict[str, Any]:
    """A successful answer's JSON object, with `keys` in it; InvalidResponseError if it
    is anything else."""
    try:
        found = json.loads(content)
    except ValueError:
        shown = content[:200].decode(errors="replace")
        raise InvalidResponseError(status, f"the answer is not JSON: {shown!r}") from None
    if not isinstance(found, dict):
        raise InvalidResponseError(status, f"the answer is not a JSON object: {found!r:.200}")
    missing = [key for key in keys if key not in found]
    if missing:
        raise InvalidResponseError(status, f"the answer has no {', '.join(missing)}")
    return found


def image_urls(job: dict[str, Any]) -> list[str]:
    """A succeeded job's image links; GoneError once retention removed them."""
    images = (job.get("result") or {}).get("images")
    if images is None or job.get("data_removed"):
        raise GoneError(
            410, {"message": f"job {job.get('id')}: its images were removed after retention"}
        )
    urls = [image.get("url") if isinstance(image, dict) else None for image in images]
    if not all(isinstance(url, str) for url in urls):
        raise InvalidResponseError(200, f"job {job.get('id')}: an image without its url")
    return urls


def result_urls(job: dict[str, Any], name: str) -> list[str]:
    """A succeeded job's links of one result list (`images`, `videos`); GoneError once
    retention removed them."""
    if name == "images":
        return image_urls(job)
    files = (job.get("result") or {}).get(name)
    if files is None or job.get("data_removed"):
        if job.get("data_removed"):
            raise GoneError(
                410, {"message": f"job {job.get('id')}: its files were removed after retention"}
            )
        raise InvalidResponseError(200, f"job {job.get('id')}: no {name} in its result")
    urls = [entry.get("url") if isinstance(entry, dict) else None for entry in files]
    if not all(isinstance(url, str) for url in urls):
        raise InvalidResponseError(200, f"job {job.get('id')}: a file without its url")
    return urls


def video_body(prompt: str | None, image: str | None, fields: dict[str, Any]) -> dict[str, Any]:
    """A video job's body: `txt2vid`, or `img2vid` from `image` (an upload's id or a
    `data:` URI)."""
    body = job_body(prompt, fields)
    body.setdefault("kind", "txt2vid" if image is None else "img2vid")
    if image is not None:
        body["image"] = image
    return body


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
    lines: list[dict[str, Any]] = []
    try:
        for number, request in enumerate(requests, 1):
            if not isinstance(request, Mapping):
                raise InputError(f"request {number} is not a mapping: {request!r:.100}")
            lines.append(dict(request))
    except TypeError as exc:
        raise InputError(f"requests must be an iterable of mappings: {exc}") from None
    body: dict[str, Any] = {"requests": lines}
    for name, value in (
        ("completion_window", completion_window),
        ("webhook", webhook),
        ("metadata", metadata),
    ):
        if value is not None:
            body[name] = value
    return body


def read_file(source: str | os.PathLike[str]) -> bytes:
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(f"cannot read {os.fspath(source)}: {reason}", path=str(source)) from None


def jsonl_file(source: str | os.PathLike[str] | bytes) -> bytes:
    """A JSON Lines file's bytes (or the bytes given), each line that is not blank a JSON
    object; InputError naming the first line that is not."""
    path = None if isinstance(source, bytes) else os.fspath(source)
    data = source if isinstance(source, bytes) else read_file(source)
    where = f"{path}, line" if path else "line"
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            found = json.loads(line)
        except ValueError as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            raise InputError(
                f"{where} {number}: not JSON ({reason})", path=path, line=number
            ) from None
        if not isinstance(found, dict):
            raise InputError(
                f"{where} {number}: not a JSON object (one request a line)", path=path, line=number
            )
    return data


class SSEParser:
    """Server-Sent Events, a line at a time: `feed(line)` gives an Event at each blank
    line that ends one; `last_id` is what to resume from."""

    def __init__(self) -> None:
        self.last_id: str | None = None
        self._name, self._data = "message", []

    def feed(self, line: str) -> Event | None:
        if line == "":
            name, lines = self._name, self._data
            self._name, self._data = "message", []
            if not lines:
                return None
            text = "\n".join(lines)
            try:
                data = json.loads(text)
            except ValueError:
                data = None
            if not isinstance(data, dict):
                raise InvalidResponseError(
                    200, f"a {name} event's data is not a JSON object: {text[:200]!r}"
                )
            return Event(name, data, self.last_id)
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


def jsonl(status: int, content: bytes) -> list[dict[str, Any]]:
    """An answer of JSON Lines (a batch's results), each line an object."""
    rows = []
    for number, line in enumerate(content.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise InvalidResponseError(
                status, f"line {number} of the answer is not a JSON object: {line[:200]!r}"
            )
        rows.append(row)
    return rows
