"""Slow clients against the API: a normal client's submit latency with 2,000 stalled
connections open from one address, against its latency without them in the same run,
and when each stalled connection was closed.

    .venv/bin/python -m bench.slow_clients [--stalled 2000] [--submits 200]
        [--modes production,embedded]

- production: `diffq api` as deployed by default (2 processes, 256 threads each) on
  PostgreSQL, RabbitMQ and S3;
- embedded: `diffq up` (one API process, 64 threads, SQLite and the filesystem broker).

The stalled connections come from 127.0.0.1 with no key, a third each: a head that never
ends, a body that stops after its first byte, and a connection that sends nothing. The
normal client submits one job at a time on a new connection each (`requests.post`), so
each submit pays for its connect. Submits under load stop before the first stalled
connection's deadline, so every one of them ran with all 2,000 open.
"""

from __future__ import annotations

import argparse
import resource
import selectors
import socket
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from app.config import load_settings
from bench.report import percentile, print_table
from bench.submit_latency import _make_key
from testbed.embedded import EmbeddedService
from testbed.processes import ApiServer
from testbed.stack import start_stack

KINDS = {
    "head": b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
    "body": b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
    "nothing": b"",
}


def _submits(url: str, key: str, count: int, until: float | None = None) -> list[float]:
    samples = []
    for i in range(count):
        if until is not None and time.monotonic() > until:
            break
        started = time.perf_counter()
        response = requests.post(
            f"{url}/v1/jobs",
            json={"prompt": f"a normal client {i}"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 202, response.text
    return samples


def _open(port: int, kind: str) -> tuple[socket.socket, str, float]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(KINDS[kind])
    return sock, kind, time.monotonic()


def _wait_closed(held: list[tuple[socket.socket, str, float]], timeout: float) -> dict:
    """Seconds from each socket's opening to its close, and what it was answered."""
    selector = selectors.DefaultSelector()
    for sock, kind, opened in held:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, [kind, opened, b""])
    closed: list[tuple[str, float, bytes]] = []
    end = time.monotonic() + timeout
    while selector.get_map() and time.monotonic() < end:
        for key, _ in selector.select(1.0):
            kind, opened, data = key.data
            try:
                chunk = key.fileobj.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if chunk:
                key.data[2] = data + chunk
                continue
            closed.append((kind, time.monotonic() - opened, data))
            selector.unregister(key.fileobj)
    left = len(selector.get_map())
    selector.close()
    return {"closed": closed, "never": left}


def _measure(mode: str, url: str, port: int, key: str, stalled: int, submits: int) -> dict:
    settings = load_settings()
    deadline = min(settings.http_header_timeout, settings.http_body_timeout)
    _submits(url, key, 10)  # warm
    base = _submits(url, key, submits)
    kinds = list(KINDS)
    with ThreadPoolExecutor(32) as pool:
        held = list(pool.map(lambda i: _open(port, kinds[i % 3]), range(stalled)))
    first_deadline = min(opened for _, _, opened in held) + deadline - 0.5
    loaded = _submits(url, key, submits, until=first_deadline)
    waited = _wait_closed(held, deadline + 60)
    for sock, _, _ in held:
        sock.close()
    after = {kind: [s for k, s, _ in waited["closed"] if k == kind] for kind in kinds}
    answered = {
        kind: sorted(
            {
                d.split(b" ", 2)[1].decode() if d else "-"
                for k, _, d in waited["closed"]
                if k == kind
            }
        )
        for kind in kinds
    }
    p99_base, p99_loaded = percentile(base, 99), percentile(loaded, 99)
    return {
        "mode": mode,
        "stalled": stalled,
        "submits": f"{len(base)}/{len(loaded)}",
        "p50 ms": f"{percentile(base, 50):.1f} -> {percentile(loaded, 50):.1f}",
        "p99 ms": f"{p99_base:.1f} -> {p99_loaded:.1f}",
        "p99 ratio": f"{p99_loaded / p99_base:.2f}",
        "closed after s (head/body/nothing)": " / ".join(
            f"{min(after[k]):.1f}-{max(after[k]):.1f}" if after[k] else "-" for k in kinds
        ),
        "answers": " / ".join(",".join(answered[k]) for k in kinds),
        "deadline s": f"{deadline:g}",
        "never closed": waited["never"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stalled", type=int, default=2000)
    parser.add_argument("--submits", type=int, default=200)
    parser.add_argument("--modes", default="production,embedded")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.stalled + 512)), hard))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if "production" in args.modes:
            stack = start_stack(Path(tmp) / "stack")
            api = ApiServer(stack.env, stack.logs, name="bench-api", workers=2, threads=256)
            try:
                api.start()
                key = _make_key(stack.database_url)
                rows.append(
                    _measure("production", api.url, api.port, key, args.stalled, args.submits)
                )
            finally:
                api.stop()
                stack.close()
        if "embedded" in args.modes:
            up = EmbeddedService(Path(tmp) / "up").start()
            try:
                rows.append(
                    _measure("embedded", up.url, up.port, up.key, args.stalled, args.submits)
                )
            finally:
                up.stop()
    print_table(
        f"A normal client's submits, alone -> with {args.stalled} stalled connections open "
        "from one address (no key): latency, and when each stalled one was closed",
        rows,
        list(rows[0]),
    )


if __name__ == "__main__":
    main()
