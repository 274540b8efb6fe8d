"""The API client the `diffq` client commands use: diffq.client (the one HTTP client of
the code), shaped as those commands call it, its errors said as a person reads them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

from diffq.client import APIConnectionError, APIError, BatchHandle, JobHandle
from diffq.client import Client as Library

__all__ = ["ApiError", "Client", "Unreachable"]

# A command's output is its own: not a log line per HTTP request.
for _name in ("httpx2", "httpcore2"):
    logging.getLogger(_name).setLevel(logging.WARNING)


MAX_LINES_SHOWN = 10  # a batch's bad lines named, of the up to 100 the API lists


class ApiError(Exception):
    """The API answered with an error: its status, its message and each field's problem,
    one per line (`width: Must be a multiple of 8 …`, a batch's `line 3: steps: …`).
    `refused`: a 4xx (the request must change); otherwise the service could not serve it
    (a 5xx, an answer that cannot be read) and the same request may do later."""

    def __init__(self, error: APIError) -> None:
        self.status = error.status
        self.errors = error.errors
        self.refused = 400 <= error.status < 500
        body = error.body
        lines: list[str] = []
        if body.get("message"):
            lines.append(str(body["message"]))
        lines += _field_problems(body.get("errors"))
        if not lines and isinstance(body.get("error"), dict):  # the OpenAI envelope
            lines.append(str(body["error"].get("message")))
        if error.retry_after:
            later = f"retry after {error.retry_after:g} s"
            lines[-1:] = [f"{lines[-1]} ({later})" if lines else later]
        head = f"HTTP {self.status} {body.get('status') or ''}".strip()
        text = head + ": " + lines[0] if len(lines) == 1 else "\n  ".join([head, *lines])
        super().__init__(text)


def _field_problems(errors) -> list[str]:
    """`errors` of the API's envelope ({"json": {"width": [...]}, "headers": {...}}, a
    batch's {"lines": {"3": {"steps": [...]}}}) as `field: message` lines."""
    lines: list[str] = []
    if not isinstance(errors, dict):
        return lines
    for where, found in errors.items():
        if where == "lines" and isinstance(found, dict):
            lines += _line_problems(found)
        elif isinstance(found, dict):
            for field, messages in found.items():
                lines += _problems(field, messages)
        elif isinstance(found, list):
            lines += [str(message) for message in found]
    return lines


def _problems(field: str, messages) -> list[str]:
    """`field: message`, for each field of a nested one (`loras.0.scale: …`)."""
    if isinstance(messages, dict):
        return [line for k, v in messages.items() for line in _problems(f"{field}.{k}", v)]
    text = " ".join(map(str, messages)) if isinstance(messages, list) else str(messages)
    return [text if field in ("_schema", "_line") else f"{field}: {text}"]


def _line_problems(lines: dict) -> list[str]:
    shown: list[str] = []
    for number, problems in list(lines.items())[:MAX_LINES_SHOWN]:
        found = problems.items() if isinstance(problems, dict) else [("_line", problems)]
        shown += [f"line {number}: {p}" for k, v in found for p in _problems(k, v)]
    if len(lines) > MAX_LINES_SHOWN:
        shown.append(f"… and {len(lines) - MAX_LINES_SHOWN} more lines")
    return shown


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
    """The library's calls the commands make, each through `_said`: an error comes out
    as ApiError or Unreachable (an input the library cannot send, its InputError, is a
    ValueError already)."""

    def __init__(self, url: str, key: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.api = Library(url, key, timeout=timeout)
        self.timeout = timeout

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc) -> None:
        self.api.close()

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

    def models(self) -> dict:
        """GET /v1/models: the models, their limits and the default's name."""
        return self._said(self.api.read, "GET", "/v1/models", "data")

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

    def submit_batch(self, path: str, **options) -> BatchHandle:
        """A JSON Lines file as one batch (its options: completion_window, webhook,
        idempotency_key)."""
        return self._said(self.api.batches.create_from_jsonl, Path(path), **options)

    def wait_batch(self, handle: BatchHandle, on_update: Callable[[dict], None]) -> dict:
        return self._said(handle.wait, on_update=on_update)

    def batch(self, batch_id: str) -> dict:
        return self._said(self.api.batches.get, batch_id)

    def batches(self, limit: int) -> dict:
        return self._said(self.api.batches.list, limit=limit)

    def cancel_batch(self, batch_id: str) -> dict:
        return self._said(self.api.batches.cancel, batch_id)

    def batch_results(self, batch_id: str) -> list[dict]:
        return self._said(self.api.batches.results, batch_id)
