"""GET /v1/jobs/{id}/ws through gunicorn, read by the `websockets` client."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket
import struct
import time

import pytest
import requests
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from testbed.jobs import auth, submit
from testbed.processes import ApiServer
from testbed.socket_fleet import (
    close_codes,
    gunicorn_worker_pid,
    open_fleet,
    rss_kib,
    threads_of,
)

pytestmark = pytest.mark.services

ORDER = ["queued", "running", "succeeded"]
SOCKETS = 100


def _ws_url(api_server, job_id: str, **query) -> str:
    url = f"ws://127.0.0.1:{api_server.port}/v1/jobs/{job_id}/ws"
    if query:
        url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    return url


def _read_all(url: str, headers=None, stop=None):
    """Messages until the server closes (or `stop(messages)`), and the close frame."""
    messages = []
    with connect(url, additional_headers=headers or {}, open_timeout=10) as ws:
        try:
            while True:
                messages.append(json.loads(ws.recv(timeout=60)))
                if stop and stop(messages):
                    return messages, None
        except ConnectionClosed as closed:
            return messages, closed.rcvd


def test_events_arrive_in_order_and_the_close_code_says_succeeded(api_server, worker, tenant_key):
    job = submit(api_server.url, tenant_key, prompt="socket me", steps=30, width=256, height=192)
    messages, close = _read_all(_ws_url(api_server, job["id"]), auth(tenant_key))
    statuses = [m["data"]["status"] for m in messages if m["event"] == "status"]
    assert statuses[-1] == "succeeded" and "running" in statuses
    assert statuses == sorted(statuses, key=ORDER.index)
    steps = [
        m["data"]["step"]
        for m in messages
        if m["event"] == "progress" and m["data"]["stage"] == "denoising"
    ]
    assert len(set(steps)) >= 2 and steps == sorted(steps)
    ids = [m["id"] for m in messages]
    assert ids == sorted(ids)
    assert close.code == 4000 and close.reason == "succeeded"


def test_a_resumed_socket_sends_only_newer_events(api_server, worker, tenant_key):
    job = submit(api_server.url, tenant_key, prompt="resume socket", steps=12)

    def started(messages):
        return any(m["event"] == "progress" and m["data"].get("step", 0) >= 2 for m in messages)

    first, _ = _read_all(_ws_url(api_server, job["id"]), auth(tenant_key), stop=started)
    seen = max(m["id"] for m in first)
    rest, close = _read_all(_ws_url(api_server, job["id"], last_event_id=seen), auth(tenant_key))
    assert rest and all(m["id"] > seen for m in rest)
    statuses = [m["data"]["status"] for m in rest if m["event"] == "status"]
    assert statuses[-1] == "succeeded" and "queued" not in statuses, rest[-1]["data"]["error"]
    assert close.code == 4000
    # Resumed after the last event of a finished job: closed at once, nothing sent.
    again, close = _read_all(
        _ws_url(api_server, job["id"], last_event_id=rest[-1]["id"]), auth(tenant_key)
    )
    assert again == [] and close.code == 4000


def test_a_ticket_opens_the_socket_without_the_key_in_the_url(api_server, worker, tenant_key):
    job = submit(api_server.url, tenant_key, prompt="browser", steps=2)
    issued = requests.post(
        f"{api_server.url}/v1/jobs/{job['id']}/ws-ticket", headers=auth(tenant_key), timeout=10
    )
    assert issued.status_code == 201
    url = issued.json()["url"]
    assert tenant_key not in url and tenant_key.split("_")[1] not in url
    messages, close = _read_all(url)
    assert messages[-1]["data"]["status"] == "succeeded" and close.code == 4000


def test_unauthenticated_and_foreign_sockets_are_refused(api_server, tenant_key, other_key):
    job = submit(api_server.url, tenant_key, prompt="private", model="tiny-b", steps=2)
    other = submit(api_server.url, tenant_key, prompt="other", model="tiny-b", steps=2)
    ticket_for_other = requests.post(
        f"{api_server.url}/v1/jobs/{other['id']}/ws-ticket", headers=auth(tenant_key), timeout=10
    ).json()["ticket"]
    refusals = [
        (_ws_url(api_server, job["id"]), {}, 401),
        (_ws_url(api_server, job["id"]), auth("dq_bad_key"), 401),
        (_ws_url(api_server, job["id"], ticket="forged"), {}, 401),
        (_ws_url(api_server, job["id"], ticket=ticket_for_other), {}, 401),
        (_ws_url(api_server, job["id"]), auth(other_key), 404),
        (_ws_url(api_server, job["id"], last_event_id="x"), auth(tenant_key), 422),
    ]
    for url, headers, status in refusals:
        with pytest.raises(InvalidStatus) as caught:
            connect(url, additional_headers=headers, open_timeout=10)
        assert caught.value.response.status_code == status, url
    for queued in (job, other):
        requests.post(queued["urls"]["cancel"], headers=auth(tenant_key), timeout=10)


def _frames(sock: socket.socket, until: float):
    """(opcode, payload) of server frames (unmasked) until the deadline."""
    buffer = b""
    while time.monotonic() < until:
        sock.settimeout(max(0.05, until - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return
        if not chunk:
            return
        buffer += chunk
        while len(buffer) >= 2:
            opcode, length, offset = buffer[0] & 0x0F, buffer[1] & 0x7F, 2
            if length == 126:
                (length,), offset = struct.unpack(">H", buffer[2:4]), 4
            elif length == 127:
                (length,), offset = struct.unpack(">Q", buffer[2:10]), 10
            if len(buffer) < offset + length:
                break
            yield opcode, buffer[offset : offset + length]
            buffer = buffer[offset + length :]


def test_the_server_pings_an_idle_socket(api_server, tenant_key):
    # DIFFQ_SSE_KEEPALIVE is 1 s in tests; no worker serves tiny-b, so nothing else happens.
    job = submit(api_server.url, tenant_key, prompt="idle", model="tiny-b", steps=2)
    with socket.create_connection(("127.0.0.1", api_server.port), timeout=10) as sock:
        sock.sendall(
            (
                f"GET /v1/jobs/{job['id']}/ws HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                f"Authorization: Bearer {tenant_key}\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101")
        opcodes = []
        for opcode, payload in _frames(sock, time.monotonic() + 3.5):
            opcodes.append(opcode)
            if opcode == 0x9:  # answer each ping with a (masked) pong, as clients must
                mask = b"\x01\x02\x03\x04"
                masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
                sock.sendall(bytes([0x8A, 0x80 | len(payload)]) + mask + masked)
        # Unanswered, a ping is followed by a close: a vanished client is noticed.
        unanswered = [op for op, _ in _frames(sock, time.monotonic() + 3.5)]
    print(f"\nframes in 3.5 s on an idle socket: {opcodes}; then, not answering: {unanswered}")
    assert opcodes[0] == 0x1  # the current status, as text
    assert opcodes.count(0x9) >= 2 and 0x8 not in opcodes  # pings, kept open
    assert 0x8 in unanswered
    requests.post(job["urls"]["cancel"], headers=auth(tenant_key), timeout=10)


@pytest.fixture(scope="module")
def roomy_api(stack):
    """One gunicorn process with a thread for every socket of the fleet test."""
    # One tenant's fleet: the stream caps lifted (tests/security tests them). Pings at the
    # default 15 s, not the suite's 1 s: a ping unanswered by the next one closes its
    # socket with 1008 (test_the_server_pings_an_idle_socket), and a loaded machine can
    # keep one client loop from answering 100 sockets' pings within a second.
    env = {
        **stack.env,
        "DIFFQ_MAX_TENANT_STREAMS": "0",
        "DIFFQ_MAX_STREAMS": "0",
        "DIFFQ_SSE_KEEPALIVE": "15",
    }
    server = ApiServer(env, stack.logs, name="api-ws", workers=1, threads=SOCKETS + 20)
    server.start()
    yield server
    server.stop()


def test_many_sockets_on_one_process_all_see_the_end(roomy_api, tenant_key):
    job = submit(roomy_api.url, tenant_key, prompt="crowd", model="tiny-b", steps=2)
    pid = gunicorn_worker_pid(roomy_api.pid)
    idle_rss, idle_threads = rss_kib(pid), threads_of(pid)

    async def scenario():
        fleet = await open_fleet(_ws_url(roomy_api, job["id"]), auth(tenant_key), SOCKETS)
        held_rss, held_threads = rss_kib(pid), threads_of(pid)
        canceled = requests.post(job["urls"]["cancel"], headers=auth(tenant_key), timeout=10)
        assert canceled.status_code == 200
        codes = await close_codes(fleet)
        return fleet, held_rss, held_threads, codes

    # Its own thread: a session-wide browser (tests/browser) may hold this thread's loop.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fleet, held_rss, held_threads, codes = pool.submit(asyncio.run, scenario()).result()
    print(
        f"\n{SOCKETS} sockets on one API process: RSS {idle_rss} -> {held_rss} KiB "
        f"(+{(held_rss - idle_rss) / SOCKETS:.1f} KiB a socket), threads {idle_threads} -> "
        f"{held_threads}; close codes {sorted(set(codes))}"
    )
    assert all(first["data"]["status"] == "queued" for first in fleet.first_events)
    assert codes == [4002] * SOCKETS  # every socket told: canceled
