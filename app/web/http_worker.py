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

A request is read whole in the worker's event loop before a thread is spent on it
(app/web/request_reader.py): a client that sends half a request holds a socket, not a
thread, until its deadline closes it; a body over its route's limit is a 413 before a
byte of it is read.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import resource
import selectors
import socket
import time
from functools import partial

from gunicorn import http, util
from gunicorn.http import wsgi
from gunicorn.workers.gthread import ThreadWorker as GthreadWorker

from app.web.request_reader import BufferedUnreader, PendingRequest, Verdict

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


# A refused or timed-out request's socket is read and discarded this long after its answer
# (then closed), so a client still sending gets the answer, not a reset.
LINGER_SECONDS = 2.0
# At most this many bytes are read from one socket per turn of the event loop.
READ_TURN = 256 * 1024
# File descriptors kept beyond the connections (logs, the database, the broker).
SPARE_FDS = 256


def _problem(status: int, reason: str, message: str) -> bytes:
    """A whole answer, closing the connection: the API's JSON problem."""
    body = json.dumps({"code": status, "status": reason, "message": message}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1") + body


class ThreadWorker(GthreadWorker):
    def init_process(self) -> None:
        _limits.update(
            line=self.cfg.limit_request_line,
            fields=self.cfg.limit_request_fields,
            field_size=self.cfg.limit_request_field_size,
        )
        util.write_error = write_json_error  # this worker process's errors only
        wsgi.Response = CountingResponse  # and its responses (wsgi.create makes them)
        self.reading: dict = {}  # connection: PendingRequest
        self.deadlines: list = []  # heap of (deadline, n, connection, PendingRequest)
        self.lingering: dict = {}  # connection: when it is closed (insertion = that order)
        self._count = itertools.count()
        self._open_files_for(self.worker_connections)
        super().init_process()

    def _open_files_for(self, connections: int) -> None:
        """Raise the soft limit on open files to what the connections need (up to the
        hard limit), or hold fewer connections than were asked for."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = connections + SPARE_FDS
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        if soft != resource.RLIM_INFINITY and soft - SPARE_FDS < connections:
            self.worker_connections = max(self.cfg.threads + 1, soft - SPARE_FDS)
            self.log.warning(
                "open files limited to %s: holding at most %s connections",
                soft,
                self.worker_connections,
            )
        self.max_keepalived = self.worker_connections - self.cfg.threads

    def run(self) -> None:
        # The app is loaded now: its limits and timeouts (app/web/factory.py).
        self.guard = self.wsgi.extensions["diffq.request_guard"]
        self.head_max = (
            self.cfg.limit_request_line
            + self.cfg.limit_request_fields * (self.cfg.limit_request_field_size + 2)
            + 8
        )
        super().run()

    # --- reading a request in the event loop ------------------------------------------

    def enqueue_req(self, conn) -> None:
        """Every request, new or on a kept-alive connection, is read whole first."""
        if self.cfg.is_ssl:
            super().enqueue_req(conn)  # TLS ends in gunicorn: bytes here are ciphertext
            return
        if conn.parser is None:
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
            conn.parser.unreader = BufferedUnreader(conn.sock)
        conn.sock.setblocking(False)
        pending = PendingRequest(
            time.monotonic(),
            header_timeout=self.guard.header_timeout,
            body_timeout=self.guard.body_timeout,
            head_max=self.head_max,
            limit=self.guard.limit,
            refusal=self.guard.refusal,
        )
        read_ahead = conn.parser.unreader.take_buffered()
        if read_ahead and self._advance(conn, pending, read_ahead, watched=False):
            return
        self.reading[conn] = pending
        heapq.heappush(self.deadlines, (pending.deadline, next(self._count), conn, pending))
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))

    def _on_readable(self, conn, _sock) -> None:
        try:
            self._read_turn(conn)
        except Exception:  # one connection's fault must not end the process's others
            self.log.exception("Error reading a request")
            self._unwatch(conn)
            self._close(conn)

    def _read_turn(self, conn) -> None:
        pending = self.reading[conn]
        received, ended = bytearray(), False
        try:
            while len(received) < READ_TURN:
                chunk = conn.sock.recv(65536)
                if not chunk:
                    ended = True
                    break
                received += chunk
        except BlockingIOError:
            pass
        except OSError:
            ended = True
        if received and self._advance(conn, pending, bytes(received), watched=True):
            return
        if ended:  # the client went away before its request was complete
            pending.close()
            self._unwatch(conn)
            self._close(conn)

    def _advance(self, conn, pending: PendingRequest, data: bytes, watched: bool) -> bool:
        """Feed `data`; True when the request is decided (handed to a thread or refused)."""
        verdict = pending.feed(data, time.monotonic())
        if pending.interim:
            self._send(conn, pending.interim)
            pending.interim = b""
        if verdict is Verdict.MORE:
            return False
        if watched:
            self._unwatch(conn)
        if verdict is Verdict.READY:
            conn.parser.unreader.load(pending)
            conn.data_ready = True
            super().enqueue_req(conn)
        else:
            self.guard.cut("too_large")
            self._answer_and_linger(conn, pending.answer, pending)
        return True

    def _unwatch(self, conn) -> None:
        self.reading.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)

    @staticmethod
    def _send(conn, data: bytes) -> None:
        with contextlib.suppress(OSError):
            conn.sock.send(data)  # small: the socket's buffer takes it whole

    def _answer_and_linger(self, conn, answer: bytes, pending: PendingRequest) -> None:
        pending.close()
        self._send(conn, answer)
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        self.lingering[conn] = time.monotonic() + LINGER_SECONDS
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_linger, conn))

    def _on_linger(self, conn, _sock) -> None:
        """Read and drop what the client still sends; close when it stops sending."""
        try:
            for _ in range(READ_TURN // 65536):
                if not conn.sock.recv(65536):
                    break
            else:
                return  # more may come: the next turn
        except BlockingIOError:
            return
        except OSError:
            pass
        self._end_linger(conn)

    def _end_linger(self, conn) -> None:
        self.lingering.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)
        self._close(conn)

    def _close(self, conn) -> None:
        self.nr_conns -= 1
        conn.close()

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        """Wake at the next deadline, not up to a second after it."""
        now = time.monotonic()
        if self.deadlines:
            timeout = min(timeout, max(0.0, self.deadlines[0][0] - now))
        if self.lingering:
            timeout = min(timeout, max(0.0, next(iter(self.lingering.values())) - now))
        super().wait_for_and_dispatch_events(timeout)

    def murder_pending(self) -> None:
        """Also: requests past their deadline are answered 408 and closed (a connection
        that never sent a byte is closed without an answer), and lingering sockets are
        closed at the end of their linger."""
        super().murder_pending()
        now = time.monotonic()
        if not self.alive:  # stopping: connections that sent nothing are not waited for
            for conn, pending in list(self.reading.items()):
                if not pending.started:
                    self._expire(conn, pending)
        while self.deadlines and self.deadlines[0][0] <= now:
            _, _, conn, pending = heapq.heappop(self.deadlines)
            if self.reading.get(conn) is not pending:
                continue  # decided since
            if pending.deadline > now:  # its body moved on
                entry = (pending.deadline, next(self._count), conn, pending)
                heapq.heappush(self.deadlines, entry)
                continue
            self._expire(conn, pending)
        while self.lingering:
            conn, until = next(iter(self.lingering.items()))
            if until > now:
                break
            self._end_linger(conn)

    def _expire(self, conn, pending: PendingRequest) -> None:
        self._unwatch(conn)
        if not pending.started:
            pending.close()
            self._close(conn)
            return
        self.guard.cut("body_timeout" if pending.in_body else "header_timeout")
        self._answer_and_linger(conn, self._timed_out(pending.in_body), pending)

    def _timed_out(self, in_body: bool) -> bytes:
        if in_body:
            message = (
                f"The request's body stopped: no byte came for {self.guard.body_timeout:g} s "
                "(DIFFQ_HTTP_BODY_TIMEOUT)."
            )
        else:
            message = (
                "The request's headers were not complete within "
                f"{self.guard.header_timeout:g} s (DIFFQ_HTTP_HEADER_TIMEOUT)."
            )
        return _problem(408, "Request Timeout", message)

    def finish_request(self, conn, fs) -> None:
        # A kept-alive connection's read-ahead (a pipelined request) is where gunicorn
        # looks for it, so it is read next, not waited for.
        unreader = getattr(conn.parser, "unreader", None)
        if (
            isinstance(unreader, BufferedUnreader)
            and not fs.cancelled()
            and fs.exception() is None
            and fs.result() is True
        ):
            unreader.flush_sources()
        super().finish_request(conn, fs)
