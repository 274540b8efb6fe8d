"""Bodies over DIFFQ_MAX_BODY_BYTES: a 413 that names the limit (and the largest field).

Under gunicorn, a body whose `Content-Length` is over its route's limit is refused before
a byte of it is read (`refusal`, written by app/web/http_worker.py's event loop): reading
it would cost what the limit is there to save. What reaches this middleware (the Flask
test client, TLS ended in gunicorn) is answered after the body is read, so a reused
keep-alive connection stays usable.

Left to Flask, an oversized body is refused unread; the server then closes a socket
with data still arriving and the client may see a connection reset instead of the 413.
This middleware reads and discards the body first (up to `drain_max` bytes; beyond that
it answers with `Connection: close`, as reading a huge body costs more than a new
connection).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

DRAIN_CHUNK = 64 * 1024


def _largest_field(body: bytes) -> tuple[str, int] | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not data:
        return None
    sizes = {str(k): len(json.dumps(v)) for k, v in data.items()}
    name = max(sizes, key=sizes.get)
    return name, sizes[name]


class BodyLimit:
    """`limit` for every route but those under a prefix of `routes` (prefix: (limit, the
    setting that sets it)): uploads of images take more than a JSON body.
    `openai_prefix`: paths answered in OpenAI's error envelope (its Images endpoint)."""

    def __init__(
        self,
        app: Callable,
        limit: int,
        drain_max: int | None = None,
        routes: dict[str, tuple[int, str]] | None = None,
        openai_prefix: str | None = None,
    ) -> None:
        self.app = app
        self.limit = limit
        self.routes = routes or {}
        largest = max([limit, *(room for room, _ in self.routes.values())])
        self.drain_max = drain_max if drain_max is not None else max(16 * limit, largest, 1 << 20)
        self.openai_prefix = openai_prefix

    def _limit(self, path: str) -> tuple[int, str]:
        for prefix, chosen in self.routes.items():
            if path == prefix or path.startswith(prefix + "/"):
                return chosen
        return self.limit, "DIFFQ_MAX_BODY_BYTES"

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        try:
            length = int(environ.get("CONTENT_LENGTH") or -1)
        except ValueError:
            length = -1
        path = environ.get("PATH_INFO", "")
        if length <= self._limit(path)[0]:
            return self.app(environ, start_response)
        body = self._drain(environ["wsgi.input"], min(length, self.drain_max))
        payload = self.answer(path, length, body)
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
        if length > self.drain_max:
            headers.append(("Connection", "close"))
        start_response("413 Payload Too Large", headers)
        return [payload]

    def limit_for(self, path: str) -> int:
        """The largest body `path` takes."""
        return self._limit(path)[0]

    def answer(self, path: str, length: int | None, body: bytes = b"") -> bytes:
        """The 413's JSON for a body of `length` bytes (None: chunked, cut at the limit)
        to `path`; `body`, where it was read whole, names its largest field."""
        limit, setting = self._limit(path)
        size = f"{length} bytes" if length is not None else f"over {limit} bytes"
        message = f"The request body is {size}; the limit is {limit} bytes ({setting})."
        answer: dict[str, Any] = {"code": 413, "status": "Payload Too Large"}
        field = _largest_field(body) if body and len(body) == length else None
        if field is not None:
            name, size_of = field
            message += f" Its largest field, '{name}', is {size_of} bytes of JSON."
            answer["errors"] = {"json": {name: [f"{size_of} bytes; the whole body is limited."]}}
        answer["message"] = message
        if self.openai_prefix and path.startswith(self.openai_prefix):
            answer = {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": field[0] if field is not None else None,
                    "code": None,
                }
            }
        return json.dumps(answer).encode()

    def refusal(self, path: str, length: int | None) -> bytes:
        """The whole HTTP answer for a body refused before it is read (the connection then
        closes: the body is not read)."""
        payload = self.answer(path, length)
        return (
            "HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode("latin-1") + payload

    @staticmethod
    def _drain(stream: Any, count: int) -> bytes:
        kept, left = [], count
        while left > 0:
            chunk = stream.read(min(DRAIN_CHUNK, left))
            if not chunk:
                break
            kept.append(chunk)
            left -= len(chunk)
        return b"".join(kept)
