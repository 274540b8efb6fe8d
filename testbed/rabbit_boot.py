"""Waiting for a RabbitMQ node to boot: failing when the boot stops moving, not when it
is merely slow. A boot's length is the machine's: four test processes on two cores once
took a quorum node past a fixed 90 s while its log still grew. Shared by the private
node of the fault scenarios (testbed/private_rabbit.py) and each node of the quorum
cluster (testbed/rabbit_cluster.py)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from testbed.ports import port_open

# A boot that keeps moving may take this many times its stall timeout in all.
STALL_FACTOR = 4


class BootWatch:
    """What a node shows of its boot. A node class sets `name`, `pid_file`, `workdir`
    (its log is under workdir/log) and `ports` (host, port: what must accept a
    connection), and says whether it serves (`serving`)."""

    name: str
    pid_file: Path
    workdir: Path
    ports: tuple[tuple[str, int], ...]

    def serving(self) -> bool:
        raise NotImplementedError

    def pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def booting(self) -> tuple[bool, int]:
        """(whether its VM is alive, how far its log has got): what a boot's progress
        is read from."""
        pid = self.pid()
        alive = pid is not None and Path(f"/proc/{pid}").exists()
        size = 0
        for log in (self.workdir / "log").glob("*.log"):
            with contextlib.suppress(OSError):
                size += log.stat().st_size
        return alive, size

    def wait_serving(self, timeout: float) -> None:
        """Until the node serves, failing when its boot stops moving: its VM gone, or its
        log unchanged for `timeout` seconds (RabbitMQ's recovery hang), not when it is
        merely slow; at most `STALL_FACTOR` x `timeout` in all.

        Its ports are probed first (a TCP connect costs nothing), then rabbitmqctl. Each
        rabbitmqctl call starts an Erlang VM, about a CPU-second: three booting nodes
        polled that way twice a second starved each other of a 2-core machine's CPU, and
        a node once took longer than its timeout to start."""
        begun = moved = time.monotonic()
        last: tuple[bool, int] | None = None
        while True:
            now = time.monotonic()
            state = self.booting()
            if state != last:
                moved, last = now, state
            if self.pid() is not None and not state[0]:
                raise RuntimeError(f"RabbitMQ node {self.name} died booting:\n{self.tail()}")
            if now - moved > timeout or now - begun > STALL_FACTOR * timeout:
                raise TimeoutError(
                    f"RabbitMQ node {self.name} did not start (its boot stalled "
                    f"{now - moved:.0f} s, {now - begun:.0f} s in all):\n{self.tail()}"
                )
            if all(port_open(host, port) for host, port in self.ports) and self.serving():
                return
            time.sleep(0.5)

    def log(self) -> str:
        found = sorted((self.workdir / "log").glob("*@*.log"))
        return found[0].read_text(errors="replace") if found else ""

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.log().splitlines()[-lines:])
