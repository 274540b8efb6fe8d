"""The close frame of GET /v1/jobs/{id}/ws reaches the client even when the reader
thread pings while it is being written (app/web/websocket.py)."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from app.web.websocket import SerialServer

PING_INTERVAL = 0.1
CLOSE_WRITE = 0.4  # the close frame's write takes this long: the reader pings meanwhile


class _SlowClose:
    """A socket whose write of a close frame (opcode 0x8) lingers, widening the window
    between the protocol's state change and the bytes on the wire to 0.4 s."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def _linger(self, data: bytes) -> None:
        if data[:1] == b"\x88":
            time.sleep(CLOSE_WRITE)

    def send(self, data: bytes) -> int:
        self._linger(data)
        return self._sock.send(data)

    def sendall(self, data: bytes) -> None:
        self._linger(data)
        self._sock.sendall(data)

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


def _handshake_environ(sock) -> dict:
    return {
        "gunicorn.socket": sock,
        "HTTP_HOST": "127.0.0.1",
        "HTTP_UPGRADE": "websocket",
        "HTTP_CONNECTION": "Upgrade",
        "HTTP_SEC_WEBSOCKET_KEY": "dGhlIHNhbXBsZSBub25jZQ==",
        "HTTP_SEC_WEBSOCKET_VERSION": "13",
    }


def _server_frames(sock: socket.socket) -> list[tuple[int, bytes]]:
    """Every frame the server sent, after its 101, until it closed the connection."""
    sock.settimeout(5)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, data = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101")
    frames = []
    while len(data) >= 2:
        opcode, length, offset = data[0] & 0x0F, data[1] & 0x7F, 2
        if length == 126:
            (length,), offset = struct.unpack(">H", data[2:4]), 4
        frames.append((opcode, data[offset : offset + length]))
        data = data[offset + length :]
    return frames


@pytest.fixture
def pair():
    server_side, client_side = socket.socketpair()
    yield _SlowClose(server_side), client_side
    server_side.close()
    client_side.close()


def test_a_ping_during_the_close_waits_for_the_close_frame(pair):
    server_side, client_side = pair
    ws = SerialServer.accept(_handshake_environ(server_side), ping_interval=PING_INTERVAL)
    ws.send('{"event": "status"}')
    ws.close(reason=4002, message="canceled")  # the reader's first ping falls inside
    ws.thread.join(5)
    frames = _server_frames(client_side)
    opcodes = [opcode for opcode, _ in frames]
    print(f"\nframes the client read: {opcodes}")
    assert opcodes[0] == 0x1
    assert opcodes[-1] == 0x8, "the connection dropped without its close frame"
    code, reason = struct.unpack(">H", frames[-1][1][:2])[0], frames[-1][1][2:]
    assert (code, reason) == (4002, b"canceled")
    assert not ws.thread.is_alive()  # the reader stopped: its ping was refused, after
