"""A loopback TCP proxy whose link can be cut: how tests make a real server unreachable."""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading

from testbed.ports import free_port


class FaultProxy:
    """Forwards 127.0.0.1:port to a target; `down()` resets every connection until `up()`;
    `lag` holds each new connection's bytes that many seconds before the first is
    forwarded (a server slow to answer a handshake)."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.refused = 0
        self.forwarded = 0
        self.lag = 0.0
        self._down = threading.Event()
        self._refuse_next = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def down(self) -> None:
        self._down.set()
        with self._lock:
            for sock in list(self._open):
                _close(sock)

    def up(self) -> None:
        self._down.clear()

    def refuse_next(self, count: int) -> None:
        """Reset the next `count` new connections, then forward again."""
        with self._lock:
            self._refuse_next = count

    def stop(self) -> None:
        self._stop.set()
        self.down()
        self._thread.join(timeout=5)
        self._listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                refuse = self._down.is_set() or self._refuse_next > 0
                self._refuse_next = max(0, self._refuse_next - 1)
            if refuse:
                self.refused += 1
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                _close(client)  # an RST: the client sees "connection reset"
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            self.forwarded += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        with self._lock:
            self._open.update((a, b))
        try:
            self._stop.wait(self.lag)
            while not self._stop.is_set() and not self._down.is_set():
                readable, _, _ = select.select([a, b], [], [], 0.2)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (b if sock is a else a).sendall(data)
        except OSError:
            return
        finally:
            with self._lock:
                self._open.difference_update((a, b))
            _close(a)
            _close(b)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
