"""The API's gunicorn worker: gthread, with the errors gunicorn answers by itself in JSON.

A request gunicorn cannot parse never reaches Flask: headers over its limits (`431`), a
request line over its limit (`414`), a malformed request (`400`). gunicorn writes those
as HTML; every other answer of the API is a JSON problem (`code`, `status`, `message`),
so a client that reads JSON would choke on exactly the errors it least expects. This
worker class replaces gunicorn's error writer, in its own process only, with one that
writes the same envelope. `diffq api` runs it (`cli/serve.py`).

A file sent whole (`wsgi.file_wrapper`: Flask's `send_file`, an image of the local store,
the page's files) goes out with `sendfile`, which gunicorn does not count in the
response's `sent`: the access log said `200 0` for every download. The worker's
responses count those bytes too, so the log's size is what went on the wire.
"""

from __future__ import annotations

import json

from gunicorn import util
from gunicorn.http import wsgi
from gunicorn.workers.gthread import ThreadWorker as GthreadWorker

_limits = {"line": 4094, "fields": 100, "field_size": 8190}


def _message(status: int, detail: str) -> str:
    if status == 431:
        return (
            f"The request's headers are too large: at most {_limits['fields']} header "
            f"fields of at most {_limits['field_size']} bytes each ({detail})."
        )
    if status == 414:
        return f"The request line (method, path and query) is over {_limits['line']} bytes."
    if status >= 500:
        return "Internal server error."
    return detail or "The request could not be read as HTTP."


def write_json_error(sock, status: int, reason: str, detail: str) -> None:
    """gunicorn's `util.write_error`, writing the API's JSON problem instead of HTML."""
    body = json.dumps(
        {"code": status, "status": reason, "message": _message(status, detail)}
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


class _CountingSocket:
    """A response's socket that counts the bytes its `sendfile` puts on the wire."""

    def __init__(self, sock) -> None:
        self._sock = sock
        self.sent = 0

    def sendfile(self, file, offset: int = 0, count: int | None = None) -> int:
        sent = self._sock.sendfile(file, offset=offset, count=count)
        self.sent += sent
        return sent

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


class CountingResponse(wsgi.Response):
    """gunicorn's response, with a file sent by `sendfile` counted in `sent` (the body
    bytes the access log writes, `%(b)s` and `%(B)s`), as `write` counts the rest."""

    def sendfile(self, respiter) -> bool:
        sock = self.sock
        counting = _CountingSocket(sock)
        self.sock = counting
        try:
            return super().sendfile(respiter)
        finally:
            self.sock = sock
            self.sent += counting.sent


class ThreadWorker(GthreadWorker):
    def init_process(self) -> None:
        _limits.update(
            line=self.cfg.limit_request_line,
            fields=self.cfg.limit_request_fields,
            field_size=self.cfg.limit_request_field_size,
        )
        util.write_error = write_json_error  # this worker process's errors only
        wsgi.Response = CountingResponse  # and its responses (wsgi.create makes them)
        super().init_process()
