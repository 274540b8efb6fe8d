"""simple-websocket's server with one writer at a time: what GET /v1/jobs/{id}/ws runs.

Two threads write to each socket: the view's (messages, then the close frame) and
simple-websocket's reader (pings, pongs, the reply to a client's close). The library
changes the protocol state and writes the bytes as two steps, unlocked. If the reader
sends its ping between the view's two steps of the close, the ping is refused ("cannot
be sent in state LOCAL_CLOSING"), the reader closes the socket, and the close frame is
written to a closed socket: the client sees the connection drop (1006) instead of the
code of the job's terminal state.

Here each event's state change and its bytes on the wire happen under one lock, in the
order of the state changes: a ping that loses the race finds the close frame already
written, and nothing is ever written after it.
"""

from __future__ import annotations

import contextlib
import threading

from simple_websocket import ConnectionClosed, Server
from wsproto import WSConnection
from wsproto.events import CloseConnection, Event, TextMessage
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError


class _Wire:
    """A wsproto connection whose `send` writes the event's bytes itself, under a lock
    (and returns none, so the library's own write of them is a no-op)."""

    def __init__(self, connection: WSConnection, sock) -> None:
        self._connection = connection
        self._sock = sock
        self._lock = threading.Lock()

    def send(self, event: Event) -> bytes:
        with self._lock:
            self._sock.sendall(self._connection.send(event))
        return b""

    def __getattr__(self, name: str):  # receive_data, events, state: the reader's, as is
        return getattr(self._connection, name)


class SerialServer(Server):
    def handshake(self) -> None:
        super().handshake()  # answered before the reader thread starts
        self.ws = _Wire(self.ws, self.sock)

    def send(self, data: str) -> None:
        if not self.connected:
            raise ConnectionClosed(self.close_reason, self.close_message)
        try:
            self.ws.send(TextMessage(data=data))
        except (OSError, LocalProtocolError) as gone:  # the peer left, or closed first
            self.connected = False
            raise ConnectionClosed(self.close_reason, self.close_message) from gone

    def close(self, reason: int | None = None, message: str | None = None) -> None:
        if not self.connected:
            raise ConnectionClosed(self.close_reason, self.close_message)
        # The peer may have left, or its own close came first (and the reader answered it).
        with contextlib.suppress(OSError, LocalProtocolError):
            self.ws.send(CloseConnection(reason or CloseReason.NORMAL_CLOSURE, message))
        self.connected = False
