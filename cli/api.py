"""The API client the `diffq` client commands use: diffq.client (the one HTTP client of
the code), shaped as those commands call it, its errors said as a person reads them."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from diffq.client import APIConnectionError, APIError, JobHandle
from diffq.client import Client as Library

__all__ = ["ApiError", "Client", "Unreachable"]

# A command's output is its own: not a log line per HTTP request.
for _name in ("httpx2", "httpcore2"):
    logging.getLogger(_name).setLevel(logging.WARNING)


class ApiError(Exception):
    """The API answered with an error: its status, its message and each field's problem,
    one per line (`width: Must be a multiple of 8 …`)."""

    def __init__(self, error: APIError) -> None:
        self.status = error.status
        self.errors = error.errors
        body = error.body
        lines: list[str] = []
        if body.get("message"):
            lines.append(str(body["message"]))
        lines += _field_problems(body.get("errors"))
        if not lines and isinstance(body.get("error"), dict):  # the OpenAI envelope
            lines.append(str(body["error"].get("message")))
        if error.retry_after:
            lines.append(f"retry after {error.retry_after:g} s")
        head = f"HTTP {self.status} {body.get('status') or ''}".strip()
        text = head + ": " + lines[0] if len(lines) == 1 else "\n  ".join([head, *lines])
        super().__init__(text)


def _field_problems(errors) -> list[str]:
    """`errors` of the API's envelope ({"json": {"width": [...]}, "headers": {...}}) as
    `field: message` lines."""
    lines: list[str] = []
    if not isinstance(errors, dict):
        return lines
    for where in errors.values():
        if isinstance(where, dict):
            for field, messages in where.items():
                text = " ".join(map(str, messages)) if isinstance(messages, list) else messages
                lines.append(text if field == "_schema" else f"{field}: {text}")
        elif isinstance(where, list):
            lines += [str(message) for message in where]
    return lines


class Unreachable(Exception):
    """No answer from the API at all (refused, unknown host, timed out)."""

    def __init__(self, url: str, exc: Exception) -> None:
        inner = str(exc).lower()
        reason = "connection refused" if "refused" in inner else "no connection"
        if "timed out" in inner or "timeout" in type(exc).__name__.lower():
            reason = "timed out"
        super().__init__(
            f"cannot reach the API at {url} ({reason}). Is it running? Start it with "
            "scripts/up (or diffq api), or point --url / DIFFQ_URL at it."
        )


class Client:
    def __init__(self, url: str, key: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.api = Library(url, key, timeout=timeout)
        self.timeout = timeout

    def _said(self, call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except APIError as exc:
            raise ApiError(exc) from None
        except APIConnectionError as exc:
            raise Unreachable(self.url, exc.__cause__ or exc) from None

    def submit(self, body: dict, idempotency_key: str | None = None) -> dict:
        return self._said(self.api.jobs.create, idempotency_key=idempotency_key, **body).job

    def get(self, job_id: str) -> dict:
        return self._said(self.api.jobs.get, job_id)

    def list(self, status: str | None, limit: int) -> dict:
        return self._said(self.api.jobs.list, status=status, limit=limit)

    def cancel(self, job_id: str) -> dict:
        return self._said(self.api.jobs.cancel, job_id)

    def upload(self, path: str) -> dict:
        """An input image stored for the tenant (POST /v1/uploads)."""
        return self._said(self.api.uploads.create, path)

    def events(self, job_id: str) -> Iterator[tuple[str, dict]]:
        """(event name, data) from the job's event stream, resuming if the connection drops."""
        stream = JobHandle(self.api, {"id": job_id}).stream()
        while True:
            try:
                event = self._said(next, stream)
            except StopIteration:
                return
            yield event.name, event.data

    def download(self, url: str) -> bytes:
        return self._said(self.api.download, url)
