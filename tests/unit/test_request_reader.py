"""Reading a request whole before a thread takes it (app/web/request_reader.py): where a
request ends, however its bytes are split, and what is refused before it is read."""

from __future__ import annotations

import io

import pytest
from gunicorn.config import Config
from gunicorn.http.parser import RequestParser

from app.web.request_reader import (
    CONTINUE,
    BufferedUnreader,
    ChunkScanner,
    Malformed,
    PendingRequest,
    Verdict,
    parse_head,
)

LIMITS = {"/v1/uploads": 1000}


def _pending(now: float = 0.0) -> PendingRequest:
    return PendingRequest(
        now,
        header_timeout=10,
        body_timeout=5,
        head_max=8192,
        limit=lambda path: LIMITS.get(path, 100),
        refusal=lambda path, length: f"413 {path} {length}".encode(),
    )


def _feed_in_pieces(stream: bytes, size: int) -> tuple[PendingRequest, list[Verdict], int]:
    """Feed `stream` `size` bytes at a time until a verdict; (request, verdicts, bytes fed)."""
    pending = _pending()
    verdicts, fed = [], 0
    while fed < len(stream):
        verdicts.append(pending.feed(stream[fed : fed + size], now=1.0))
        fed = min(fed + size, len(stream))
        if verdicts[-1] is not Verdict.MORE:
            break
    return pending, verdicts, fed


def _body_of(pending: PendingRequest) -> bytes:
    pending.body.seek(0)
    return pending.body.read()


POST = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world"
CHUNKED = (
    b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 10_000])
@pytest.mark.parametrize("request_bytes", [POST, CHUNKED], ids=["length", "chunked"])
def test_a_request_is_ready_at_its_last_byte_however_it_is_split(request_bytes, size):
    stream = request_bytes + b"GET / HTTP/1.1\r\n"
    pending, verdicts, fed = _feed_in_pieces(stream, size)
    assert verdicts[-1] is Verdict.READY
    assert all(v is Verdict.MORE for v in verdicts[:-1])
    assert fed >= len(request_bytes) and fed - size < len(request_bytes)
    assert pending.head.path == "/v1/jobs"
    # The request as it came, and nothing of the next one in it.
    assert pending.head_bytes + _body_of(pending) == request_bytes
    assert pending.extra == stream[len(request_bytes) : fed]


def test_a_whole_request_at_once_keeps_the_pipelined_next_one_apart():
    pending = _pending()
    assert pending.feed(POST + b"GET /healthz HTTP/1.1\r\n\r\n", now=1.0) is Verdict.READY
    assert _body_of(pending) == b"hello world"
    assert pending.extra == b"GET /healthz HTTP/1.1\r\n\r\n"


def test_a_body_announced_over_the_routes_limit_is_refused_from_its_head():
    pending = _pending()
    head = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n"
    assert pending.feed(head, now=1.0) is Verdict.REFUSED
    assert pending.answer == b"413 /v1/jobs 10000000000"
    assert pending.body is None  # not a byte of the body was asked for

    uploads = _pending()
    head = b"POST /v1/%75ploads?x=1 HTTP/1.1\r\nContent-Length: 500\r\n\r\n"
    assert uploads.feed(head, now=1.0) is Verdict.MORE  # the route takes 1000
    assert uploads.head.path == "/v1/uploads"


def test_a_chunked_body_is_refused_once_it_passes_the_limit():
    pending = _pending()
    head = b"POST /v1/jobs HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert pending.feed(head + b"40\r\n" + b"a" * 64 + b"\r\n", now=1.0) is Verdict.MORE
    assert pending.feed(b"40\r\n" + b"a" * 64 + b"\r\n", now=2.0) is Verdict.REFUSED
    assert pending.answer == b"413 /v1/jobs None"


def test_headers_have_one_deadline_and_a_body_a_deadline_per_byte():
    pending = _pending(now=100.0)
    pending.feed(b"POST /v1/jobs HTTP/1.1\r\n", now=101.0)
    pending.feed(b"Host: x\r\n", now=108.0)
    assert pending.deadline == 110.0  # from the connection, not from the last byte
    pending.feed(b"Content-Length: 5\r\n\r\nab", now=109.0)
    assert pending.deadline == 114.0
    pending.feed(b"c", now=113.0)
    assert pending.deadline == 118.0 and pending.in_body


def test_expect_100_continue_is_answered_here_and_not_again_by_gunicorn():
    pending = _pending()
    head = b"POST /v1/jobs HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"
    assert pending.feed(head, now=1.0) is Verdict.MORE
    assert pending.interim == CONTINUE
    assert b"expect" not in pending.head_bytes.lower()
    assert pending.feed(b"12345", now=1.0) is Verdict.READY


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/9.9 extra\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"POST / HTTP/1.1\r\nBad Header : x\r\n\r\n",
    ],
)
def test_what_it_cannot_frame_goes_to_gunicorns_parser_as_it_stands(head):
    assert parse_head(head) is None
    pending = _pending()
    assert pending.feed(head, now=1.0) is Verdict.READY
    assert pending.head_bytes == head


def test_a_head_over_the_limit_goes_to_gunicorn_which_answers_431():
    pending = _pending()
    assert pending.feed(b"GET / HTTP/1.1\r\nX: " + b"a" * 9000, now=1.0) is Verdict.READY


@pytest.mark.parametrize("size", [b"0x5", b"+5", b"5 5", b"", b"1_0"])
def test_chunk_sizes_are_hex_digits_only(size):
    with pytest.raises(Malformed):
        ChunkScanner().feed(size + b"\r\nhello\r\n0\r\n\r\n")


def test_gunicorns_parser_reads_the_request_from_the_buffered_unreader():
    """The head from memory, the body from the spool, the next request after it."""
    pending = _pending()
    pending.feed(CHUNKED + b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n", now=1.0)

    class NoSocket:
        def recv(self, size):
            raise AssertionError("read past what the event loop read")

    parser = RequestParser(Config(), NoSocket(), ("127.0.0.1", 1))
    parser.unreader = BufferedUnreader(NoSocket())
    parser.unreader.load(pending)
    request = next(parser)
    assert request.path == "/v1/jobs" and request.body.read() == b"hello world"
    parser.unreader.flush_sources()
    following = next(parser)
    assert following.path == "/next"
    assert isinstance(parser.unreader.buf, io.BytesIO)
