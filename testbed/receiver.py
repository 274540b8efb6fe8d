"""A real webhook receiver on loopback: answers from a script, records every request."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from testbed.ports import free_port


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    answered: int


@dataclass
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # a receiver that hangs


class Receiver:
    """`script` is consumed one answer per request; when empty, `default` answers."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.received: list[Received] = []
        self.script: list[Answer] = []
        self.default = Answer(200)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver._lock:
                    answer = receiver.script.pop(0) if receiver.script else receiver.default
                    receiver.received.append(
                        Received(
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            time.monotonic(),
                            answer.status,
                        )
                    )
                if answer.delay:
                    time.sleep(answer.delay)
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the caller gave up waiting

            def log_message(self, *_args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def requests(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self.received if path is None or r.path == path]
