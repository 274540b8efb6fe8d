"""Slow clients cannot pin the API (app/web/request_reader.py), in both modes: 500
half-sent requests, without a key, leave it answering, and each is answered 408 and
closed at its deadline; a body announced over its route's limit is a 413 before a byte
of it is read."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from app.config import load_settings
from testbed.jobs import auth

pytestmark = pytest.mark.services

STALLED = 500


@pytest.fixture(params=["production", "embedded"])
def front(request) -> tuple[str, int, str]:
    """(mode, port, key): the API under gunicorn on PostgreSQL, RabbitMQ and S3; then
    `diffq up`. No worker: nothing here needs a job to run."""
    if request.param == "production":
        server = request.getfixturevalue("api_server")
        return "production", server.port, request.getfixturevalue("tenant_key")
    up = request.getfixturevalue("embedded")
    return "embedded", up.port, up.new_key()


def _open(port: int, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(data)
    return sock


def _answer(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """Everything the server writes until it closes: (bytes, closed within `timeout`)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data, False
    except ConnectionResetError:
        pass
    return data, True


def test_500_stalled_requests_leave_the_api_answering_and_are_cut_at_their_deadline(front):
    mode, port, key = front
    settings = load_settings()
    url = f"http://127.0.0.1:{port}"
    half_heads = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    half_bodies = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        sockets = list(
            pool.map(lambda i: _open(port, half_heads if i % 2 else half_bodies), range(STALLED))
        )
    opened = time.monotonic()
    try:
        # The API answers while every one of them is held open: a submit and a read.
        before = time.monotonic()
        submitted = requests.post(
            f"{url}/v1/jobs", json={"prompt": "past the stalled"}, headers=auth(key), timeout=30
        )
        listed = requests.get(f"{url}/v1/jobs", headers=auth(key), timeout=30)
        answered_s = time.monotonic() - before
        assert submitted.status_code == 202, submitted.text
        assert listed.status_code == 200

        # Each is then answered 408 and closed, at its deadline: wait on each close.
        deadline = max(settings.http_header_timeout, settings.http_body_timeout)
        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(lambda s: _answer(s, deadline + 60), sockets))
        closed_s = time.monotonic() - opened
    finally:
        for sock in sockets:
            sock.close()
    never_closed = sum(not closed for _, closed in answers)
    statuses = {data.split(b" ", 2)[1] if data else b"-" for data, _ in answers}
    print(
        f"\n{mode}: {STALLED} stalled requests opened in {opened - started:.1f} s; a submit "
        f"and a list answered in {answered_s:.2f} s meanwhile; all closed "
        f"{closed_s:.1f} s after opening (deadline {deadline:g} s); never closed: "
        f"{never_closed}; statuses: {sorted(statuses)}"
    )
    assert never_closed == 0
    assert statuses == {b"408"}
    # Not before the deadline: a slow but live client gets its full time.
    assert closed_s >= min(settings.http_header_timeout, settings.http_body_timeout) - 1
    body = json.loads(answers[0][0].partition(b"\r\n\r\n")[2])
    assert body["code"] == 408 and "DIFFQ_HTTP_" in body["message"]


def test_a_body_over_the_routes_limit_is_a_413_before_a_byte_of_it_is_sent(front):
    mode, port, _ = front
    for path, setting in (
        ("/v1/jobs", "DIFFQ_MAX_BODY_BYTES"),
        ("/v1/uploads", "DIFFQ_INPUT_MAX_BYTES"),
        ("/v1/images/generations", "DIFFQ_MAX_BODY_BYTES"),  # in OpenAI's envelope
    ):
        sock = _open(
            port,
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n".encode(),
        )
        with sock:
            data, closed = _answer(sock, 30)
        head, _, body = data.partition(b"\r\n\r\n")
        print(f"\n{mode} {path}: {head.splitlines()[0].decode() if head else 'nothing'}")
        assert head.startswith(b"HTTP/1.1 413 "), data
        assert closed, "the connection stays open for a body it will not read"
        problem = json.loads(body)
        message = problem["error"]["message"] if "images" in path else problem["message"]
        assert "10000000000 bytes" in message and setting in message


def test_an_expect_100_continue_body_under_the_limit_is_asked_for_and_served(front):
    _, port, key = front
    payload = json.dumps({"prompt": "after the interim answer"}).encode()
    head = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nExpect: 100-continue\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with _open(port, head) as sock:
        sock.settimeout(30)
        interim = b""
        while b"\r\n\r\n" not in interim and (chunk := sock.recv(1)):
            interim += chunk
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(payload)
        data, closed = _answer(sock, 30)
    assert data.startswith(b"HTTP/1.1 202 "), data
    assert closed  # as the request asked
    assert data.count(b"100 Continue") == 0  # one interim answer, not two
