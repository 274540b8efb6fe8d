"""A request read whole before a thread is spent on it: the API's guard against slow
clients.

gunicorn's gthread worker hands a connection to a thread once its first byte arrives,
and the thread then blocks until the request's headers and body are in: a client that
sends half a request, with or without a key, holds a thread for as long as it likes, and
a few hundred such sockets stop the API. The API's worker (app/web/http_worker.py) reads
each request in its event loop instead, where a waiting socket costs a file descriptor
and a few hundred bytes, and gives it to a thread only when it is complete. This module
is that reading, with no sockets in it:

- **Headers** must be complete within DIFFQ_HTTP_HEADER_TIMEOUT of the connection (of
  the first byte of a kept-alive connection's next request).
- **A body** must keep arriving: DIFFQ_HTTP_BODY_TIMEOUT without a byte ends it.
- **A body announced larger than its route's limit** (`Content-Length`) is refused with
  `413` before a byte of it is read; a chunked body is refused once it passes the limit.
- A body is held in memory up to SPOOL_MEMORY bytes and on disk beyond, so a large
  upload does not cost its size in memory.
- `Expect: 100-continue` is answered here, when the body is wanted.

Whatever this reader cannot frame (a malformed head, an ambiguous length, a head over
gunicorn's limits) is handed over as it stands: gunicorn's parser answers it (400, 414,
431) from the bytes already read, so one parser decides what a request means.
"""

from __future__ import annotations

import io
import re
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from urllib.parse import unquote

from gunicorn.http.unreader import SocketUnreader

SPOOL_MEMORY = 1024 * 1024
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_LINE_MAX = 8192  # a chunk-size line or trailer line longer than this is malformed


@dataclass(frozen=True)
class RequestGuard:
    """What the API's worker reads requests with (built by app/web/factory.py):
    the deadlines, the largest body a path takes and the 413 that refuses one over it,
    and `cut(reason)`, counting a request closed here (diffq_http_requests_cut_total)."""

    header_timeout: float
    body_timeout: float
    limit: Callable[[str], int]
    refusal: Callable[[str, int | None], bytes]
    cut: Callable[[str], None]


class Verdict(Enum):
    MORE = "more"  # keep reading
    READY = "ready"  # hand it to a thread
    REFUSED = "refused"  # answer `refusal` and close


@dataclass(frozen=True)
class Head:
    method: str
    path: str  # decoded as gunicorn decodes PATH_INFO
    http11: bool
    length: int | None  # Content-Length
    chunked: bool
    expect_continue: bool


def parse_head(head: bytes) -> Head | None:
    """The request line and the framing headers of `head` (ending in a blank line), or
    None where gunicorn's parser should judge it (malformed, or an ambiguous length)."""
    lines = head.lstrip(b"\r\n").split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
        return None
    lengths: list[bytes] = []
    codings: list[bytes] = []
    expect = False
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep or name != name.strip():
            return None
        name, value = name.lower(), value.strip()
        if name == b"content-length":
            lengths.append(value)
        elif name == b"transfer-encoding":
            codings += [c.strip().lower() for c in value.split(b",")]
        elif name == b"expect" and value.lower() == b"100-continue":
            expect = True
    if len(lengths) > 1 or (lengths and codings) or (codings and codings[-1] != b"chunked"):
        return None
    if lengths and not lengths[0].isdigit():
        return None
    target = parts[1].decode("latin-1")
    path = target.split("?", 1)[0].split("#", 1)[0]
    if "://" in path:  # absolute form: the path after the authority
        path = "/" + path.split("://", 1)[1].partition("/")[2]
    http11 = parts[2] == b"HTTP/1.1"
    return Head(
        method=parts[0].decode("latin-1"),
        path=unquote(path, encoding="latin-1"),
        http11=http11,
        length=int(lengths[0]) if lengths else None,
        chunked=bool(codings),
        expect_continue=expect and http11,
    )


def without_expect(head: bytes) -> bytes:
    """`head` less its `Expect: 100-continue` line: this reader has answered it, and
    gunicorn would answer it again."""
    lines = head.split(b"\r\n")
    kept = [
        line
        for line in lines
        if not (
            line.partition(b":")[0].lower() == b"expect"
            and line.partition(b":")[2].strip().lower() == b"100-continue"
        )
    ]
    return b"\r\n".join(kept)


class Malformed(ValueError):
    pass


class ChunkScanner:
    """Where a chunked body (RFC 9112 §7.1) ends, and how many data bytes it carries."""

    def __init__(self) -> None:
        self.state = "size"  # size, data, data_end, trailer
        self.line = bytearray()
        self.left = 0
        self.size = 0

    def feed(self, data: bytes) -> int | None:
        """Scan `data`; the index just past the body's end when it ends in `data`."""
        i, n = 0, len(data)
        while i < n:
            if self.state == "data":
                take = min(self.left, n - i)
                i += take
                self.left -= take
                if not self.left:
                    self.state = "data_end"
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self.line += data[i:]
                if len(self.line) > _LINE_MAX:
                    raise Malformed("line too long")
                return None
            self.line += data[i:j]
            i = j + 1
            line = bytes(self.line).removesuffix(b"\r")
            self.line.clear()
            if self.state == "size":
                digits = line.split(b";", 1)[0].strip()
                if not _HEX.fullmatch(digits):
                    raise Malformed("chunk size")
                size = int(digits, 16)
                self.size += size
                self.left = size
                self.state = "data" if size else "trailer"
            elif self.state == "data_end":
                if line:
                    raise Malformed("chunk end")
                self.state = "size"
            elif not line:  # the blank line after the trailers
                return i
        return None


class PendingRequest:
    """One request being read: its head, its body so far, and when it must be complete.

    `limit(path)` is the largest body the path takes; `refusal(path, length)` the whole
    HTTP answer (bytes) for a body over it (`length` None: a chunked body)."""

    def __init__(
        self,
        now: float,
        *,
        header_timeout: float,
        body_timeout: float,
        head_max: int,
        limit: Callable[[str], int],
        refusal: Callable[[str, int | None], bytes],
    ) -> None:
        self.deadline = now + header_timeout
        self.body_timeout = body_timeout
        self.head_max = head_max
        self._limit = limit
        self._refusal = refusal
        self.data = bytearray()  # the head as it arrives
        self.head: Head | None = None
        self.head_bytes = b""
        self.body: tempfile.SpooledTemporaryFile | None = None
        self.received = 0  # body bytes
        self.extra = b""  # bytes past the end of this request (a pipelined next one)
        self.interim = b""  # to write now (100 Continue)
        self.answer = b""  # the refusal, with REFUSED
        self._chunks: ChunkScanner | None = None

    @property
    def started(self) -> bool:
        return bool(self.data or self.head_bytes)

    @property
    def in_body(self) -> bool:
        return self.head is not None

    def feed(self, data: bytes, now: float) -> Verdict:
        if self.head is None:
            return self._feed_head(data, now)
        return self._feed_body(data, now)

    def _ready_as_is(self) -> Verdict:
        """Hand over everything read: gunicorn's parser judges it."""
        self.head_bytes, self.data = bytes(self.data), bytearray()
        return Verdict.READY

    def _feed_head(self, data: bytes, now: float) -> Verdict:
        start = max(0, len(self.data) - 3)
        self.data += data
        end = self.data.find(b"\r\n\r\n", start)
        if end < 0:
            return self._ready_as_is() if len(self.data) > self.head_max else Verdict.MORE
        head, rest = bytes(self.data[: end + 4]), bytes(self.data[end + 4 :])
        parsed = parse_head(head)
        if parsed is None:
            return self._ready_as_is()
        self.data = bytearray()
        self.head, self.head_bytes = parsed, head
        limit = self._limit(parsed.path)
        if parsed.length is not None and parsed.length > limit:
            self.answer = self._refusal(parsed.path, parsed.length)
            return Verdict.REFUSED
        if not parsed.chunked and not parsed.length:
            self.extra = rest
            return Verdict.READY
        if parsed.expect_continue:
            self.head_bytes = without_expect(head)
            if not rest:
                self.interim = CONTINUE
        # Closed by the unreader once read, or by close().
        self.body = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY)  # noqa: SIM115
        if parsed.chunked:
            self._chunks = ChunkScanner()
        return self._feed_body(rest, now)

    def _feed_body(self, data: bytes, now: float) -> Verdict:
        assert self.head is not None and self.body is not None
        self.deadline = now + self.body_timeout
        if self._chunks is not None:
            try:
                end = self._chunks.feed(data)
            except Malformed:
                end = len(data)  # gunicorn's parser answers it
            body, self.extra = (data, b"") if end is None else (data[:end], data[end:])
            if self._chunks.size > self._limit(self.head.path):
                self.answer = self._refusal(self.head.path, None)
                return Verdict.REFUSED
            self._keep(body)
            return Verdict.MORE if end is None else Verdict.READY
        left = self.head.length - self.received
        self._keep(data[:left])
        if self.received < self.head.length:
            return Verdict.MORE
        self.extra = data[left:]
        return Verdict.READY

    def _keep(self, data: bytes) -> None:
        if data:
            self.body.write(data)
            self.received += len(data)

    def close(self) -> None:
        if self.body is not None:
            self.body.close()


class BufferedUnreader(SocketUnreader):
    """gunicorn's socket unreader, reading what the event loop read first: the body it
    spooled and any bytes past it, in order, then the socket."""

    def __init__(self, sock) -> None:
        super().__init__(sock)
        self.sources: deque = deque()

    def load(self, request: PendingRequest) -> None:
        self.unread(request.head_bytes)
        if request.body is not None:
            request.body.seek(0)
            self.sources.append(request.body)
        if request.extra:
            self.sources.append(io.BytesIO(request.extra))

    def chunk(self, size_hint=None) -> bytes:
        while self.sources:
            data = self.sources[0].read(max(self.mxchunk, min(size_hint or 0, SPOOL_MEMORY)))
            if data:
                return data
            self.sources.popleft().close()
        return super().chunk(size_hint)

    def flush_sources(self) -> None:
        """Move what is left of the sources into the buffer: after a kept-alive request,
        bytes past it are a pipelined next request, which gunicorn looks for there."""
        rest = b"".join(source.read() for source in self.sources)
        for source in self.sources:
            source.close()
        self.sources.clear()
        if rest:
            self.buf.seek(0, 2)
            self.buf.write(rest)
