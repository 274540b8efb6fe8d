"""A simulated network of machines on one host: a bridge in a namespace of its own (the
switch), and machines, each a network namespace with one address on it, plus this host
(the root namespace) with an address of its own, so that processes run here reach them.

    with Lan() as lan:
        node = lan.add("r1")          # a namespace; `node.address` on the bridge
        lan.isolate(node)             # its port on the switch goes down: silence both ways
        lan.rejoin(node)

Isolating a machine takes its switch port down: what it sends and what is sent to it is
dropped, nothing is refused or reset, so each side sees silence until its own timeouts
notice, as in a real partition. Only this module's namespaces and links are touched;
`close` removes them, and ends every process still running in one of them (only
processes started in these namespaces can be there).

Needs root and `ip netns` (testbed/netns.py's `available` says whether this host has
them). Addresses come from 10.214.0.0/16, a /24 not used on this host.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path

from testbed.netns import _run, _used_networks

SUPERNET = "10.214"


def _free_lan() -> ipaddress.IPv4Network:
    used = _used_networks()
    for _ in range(200):
        candidate = ipaddress.ip_network(f"{SUPERNET}.{random.randrange(256)}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise RuntimeError(f"no free /24 in {SUPERNET}.0.0/16")


@dataclass
class Machine:
    """A namespace on the LAN: `command(args)` runs `args` inside it."""

    name: str  # the namespace
    address: str
    port: str  # its switch port (in the switch's namespace)

    def command(self, args: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *args]

    def pids(self) -> list[int]:
        listed = _run("ip", "netns", "pids", self.name, check=False).stdout.split()
        return [int(pid) for pid in listed if pid.isdigit()]


class Lan:
    def __init__(self, prefix: str = "dq") -> None:
        self.tag = secrets.token_hex(2)
        self.prefix = prefix
        self.switch = f"{prefix}sw-{self.tag}"
        self.network = _free_lan()
        self.host_address = str(self.network.network_address + 1)
        self.host_dev = f"{prefix}l{self.tag}h"
        self.machines: dict[str, Machine] = {}
        self._made = False

    # --- lifecycle ------------------------------------------------------------------
    def create(self) -> Lan:
        try:
            self._made = True
            _run("ip", "netns", "add", self.switch)
            _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.switch, "link", "set", "br0", "up")
            # This host on the LAN: a veth whose other end is a switch port.
            _run("ip", "link", "add", self.host_dev, "type", "veth", "peer", "name", "hostport")
            _run("ip", "link", "set", "hostport", "netns", self.switch)
            self._plug("hostport")
            _run("ip", "addr", "add", f"{self.host_address}/24", "dev", self.host_dev)
            _run("ip", "link", "set", self.host_dev, "up")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if not self._made:
            return
        for machine in self.machines.values():
            for pid in machine.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _run("ip", "netns", "del", machine.name, check=False)
        self.machines.clear()
        _run("ip", "netns", "del", self.switch, check=False)  # its ports, the host's link
        if Path(f"/sys/class/net/{self.host_dev}").exists():
            _run("ip", "link", "del", self.host_dev, check=False)
        self._made = False

    def __enter__(self) -> Lan:
        return self.create()

    def __exit__(self, *_exc) -> None:
        self.close()

    def _plug(self, port: str) -> None:
        _run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
        _run("ip", "-n", self.switch, "link", "set", port, "up")

    # --- machines -------------------------------------------------------------------
    def add(self, name: str) -> Machine:
        """A new machine `name` on the LAN, its address the next free one."""
        index = len(self.machines) + 10
        machine = Machine(
            name=f"{self.prefix}-{name}-{self.tag}",
            address=str(self.network.network_address + index),
            port=f"p{index}",
        )
        _run("ip", "netns", "add", machine.name)
        self.machines[name] = machine
        _run(
            "ip", "link", "add", machine.port, "netns", self.switch,
            "type", "veth", "peer", "name", "eth0", "netns", machine.name,
        )  # fmt: skip
        self._plug(machine.port)
        ip = ["ip", "-n", machine.name]
        _run(*ip, "addr", "add", f"{machine.address}/24", "dev", "eth0")
        _run(*ip, "link", "set", "eth0", "up")
        _run(*ip, "link", "set", "lo", "up")
        return machine

    # --- faults ---------------------------------------------------------------------
    def isolate(self, machine: Machine) -> None:
        """Cut `machine` from every other machine and from this host."""
        _run("ip", "-n", self.switch, "link", "set", machine.port, "down")

    def rejoin(self, machine: Machine) -> None:
        _run("ip", "-n", self.switch, "link", "set", machine.port, "up")

    def isolated(self, machine: Machine) -> bool:
        shown = _run("ip", "-n", self.switch, "-o", "link", "show", machine.port).stdout
        return "state DOWN" in shown or ",UP" not in shown


def reachable(address: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection to `address:port` opens from this host."""
    import socket

    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout):
        return True
    return False
