"""Many WebSocket clients on one job at once, and the memory of the API process serving
them: shared by the WebSocket test and bench/ws_sockets.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def threads_of(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def gunicorn_worker_pid(master_pid: int) -> int:
    """The single worker process of a `--workers 1` gunicorn."""
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    if len(children) != 1:
        raise RuntimeError(f"expected one gunicorn worker, found {children}")
    return int(children[0])


@dataclass
class Fleet:
    sockets: list[ClientConnection]
    first_events: list[dict]


async def open_fleet(url: str, headers: dict[str, str], count: int, at_once: int = 50) -> Fleet:
    """`count` open sockets, each having received its first event."""
    gate = asyncio.Semaphore(at_once)

    async def one() -> tuple[ClientConnection, dict]:
        async with gate:
            ws = await connect(url, additional_headers=headers, open_timeout=60, max_queue=None)
            first = json.loads(await asyncio.wait_for(ws.recv(), 60))
            return ws, first

    pairs = await asyncio.gather(*(one() for _ in range(count)))
    return Fleet([ws for ws, _ in pairs], [first for _, first in pairs])


async def close_codes(fleet: Fleet, timeout: float = 60) -> list[int | None]:
    """Read every socket to its end; the close code the server sent each."""

    async def drain(ws: ClientConnection) -> int | None:
        with contextlib.suppress(ConnectionClosed):  # its code is reported below either way
            async for _ in ws:
                pass
        return ws.close_code

    return await asyncio.wait_for(asyncio.gather(*(drain(ws) for ws in fleet.sockets)), timeout)
